"""chattts-stream server."""

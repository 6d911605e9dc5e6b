"""chattts-stream client: generated stubs, client library and CLI."""

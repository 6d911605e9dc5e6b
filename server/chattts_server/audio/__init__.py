"""PCM encodings and resampling."""

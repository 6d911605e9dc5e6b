"""One stream's life, from its text messages to its events (docs/architecture.md).

reader.py posts each text message on the stream's inbox; stream.py's `Stream` is the one task
that owns the stream's state: it applies the messages (text_queue.py, segments.py, the text
front ends), plays the queued items (items.py) and speaks each utterance (utterance.py) on one
timeline of samples (output.py); catch_up.py keeps a caption stream's lag bounded.
"""

"""Serving engine: scheduler, model runner, streaming decode."""

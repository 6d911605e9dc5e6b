"""Errors of model loading that the engine reports by type."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model folder is missing, incomplete or fails verification, or the device is unusable."""

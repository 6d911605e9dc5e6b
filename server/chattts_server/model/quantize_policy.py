"""What `--quantize` may choose and the quality bar a lossy mode must clear, as the model code
names them. Their home is `config` (the command line shows them and config imports nothing of
the server); this module keeps the model's import of them in one place."""

from ..config import MIN_SNR_DB, QUANTIZE_CHOICES

__all__ = ["MIN_SNR_DB", "QUANTIZE_CHOICES"]

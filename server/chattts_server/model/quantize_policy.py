"""What `--quantize` may choose and the quality bar a lossy mode must clear (no torch here, so
the command line can name them)."""

QUANTIZE_CHOICES = ("none", "bf16", "int8", "auto")
"""Linear-mode families `--quantize` allows: lossless only, bf16, int8, or any within budget."""
MIN_SNR_DB = 30.0
"""A lossy mode serves under `auto` only if its hidden states are within this SNR of the
lossless mode's (autotune at warm-up; bench/bench_quality.py reports against it)."""

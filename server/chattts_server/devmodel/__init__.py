"""The random-weight dev model in ChatTTS's official asset layout, built from ChatTTS's own
classes: what `make run`, the tests and the benchmarks serve where no real weights are given
(`build_dev_assets`)."""

import logging

from ..config_model import ModelConfig
from .assets import build_dev_assets

__all__ = ["build_dev_assets", "dev_model_dir"]

log = logging.getLogger(__name__)


def dev_model_dir(config: ModelConfig) -> str:
    """The dev model's folder (built on first use), served where no weights are given."""
    log.warning(
        "serving the RANDOM-WEIGHT '%s' dev model. Its audio is noise; for speech, serve "
        "ChatTTS's weights: --model 2Noise/ChatTTS (make run), or --model-dir FOLDER.",
        config.dev_model,
    )
    return str(build_dev_assets(config.dev_model, config.dev_model_cache))

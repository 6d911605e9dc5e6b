"""The command line is generated from the config tree (`config.option` fields): the flags and
defaults are those users and manifests already rely on, every bound is checked, and the parsed
config is exactly the one the flags describe."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chattts_server.config import ConfigError, EngineConfig, ServerConfig
from chattts_server.config_cli import build_parser, config_from_args
from chattts_server.config_model import ModelConfig

# The flag set and defaults of the hand-written parser this one replaced (2026-12-01).
FLAGS = {
    "--host": "[::]",
    "--port": 50051,
    "--metrics-port": 0,
    "--http-port": 0,
    "--listen-when-ready": True,
    "--http-idle-s": 75,
    "--keepalive-time-s": 30.0,
    "--keepalive-timeout-s": 10.0,
    "--max-connection-age-s": 0.0,
    "--max-connection-age-grace-s": 60.0,
    "--model-dir": None,
    "--model": None,  # issue 51: the hub, beside --model-dir
    "--dev-model-fallback": False,
    "--hub-timeout-s": 10.0,
    "--sha256-map": None,
    "--dev-model": "tiny",
    "--dev-model-cache": "~/.cache/chattts-stream/dev-models",  # expanded where it is used
    "--allow-unverified": False,
    "--device": "auto",
    "--dtype": "auto",
    "--gguf-format": "auto",  # --quantize / --backend / --compile / --autotune-* until issue 47
    "--gguf-cache-dir": None,
    "--threads": 0,
    "--adaptive-threads": "on",
    "--voices-dir": None,
    "--lexicon": None,  # repeatable: () once parsed
    "--download-only": False,
    "--max-streams": 16,
    "--max-tokens": 1536,
    "--max-new-tokens": 768,
    "--prefill-chunk-tokens": 256,
    "--interactive-hold-tokens": 64,
    "--output-buffer-chunks": 8,
    "--no-warmup": False,
    "--first-chunk-tokens": 4,  # 8 until issue 47 (the busy first chunk's 4 under load)
    "--max-chunk-tokens": 32,
    "--lookahead-tokens": 8,
    "--first-lookahead-tokens": 4,  # --busy-batch 8 / --busy-*-tokens 4 until issue 47
    "--vocoder": "vocos",
    "--hifigan-checkpoint": None,
    "--cuda-graphs": "on",
    "--max-queue": 16,
    "--reserved-slots": 0,
    "--retry-pushback-ms": 500,
    "--grace-s": 30.0,
    "--http-linger-s": 2.0,
    "--max-text-chars": 4000,
    "--max-stream-chars": 100000,
    "--max-receive-bytes": 1048576,
    "--max-send-bytes": 8388608,
    "--max-body-bytes": 2097152,
    "--max-header-bytes": 16384,
    "--max-ws-message-bytes": 2097152,
    "--ws-max-contexts": 8,
    "--ws-context-idle-s": 60.0,
    "--stall-timeout-s": 30.0,
    "--resume-window-s": 20.0,
    "--tls-cert": None,
    "--tls-key": None,
    "--tls-client-ca": None,
    "--auth-token-file": None,
    "--no-reflection": False,
    "--log-level": "INFO",
}


def test_the_generated_parser_has_the_same_flags_and_defaults() -> None:
    actions = [a for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)]
    got = {a.option_strings[0]: a.default for a in actions}
    assert got == FLAGS


def test_no_flags_give_the_default_config() -> None:
    assert config_from_args([]) == ServerConfig()


def test_every_kind_of_flag_maps_back_to_its_field() -> None:
    cfg = config_from_args(
        [
            "--max-streams", "3", "--grace-s", "1.5", "--model-dir", "/models/x",
            "--no-warmup", "--allow-unverified", "--cuda-graphs", "off", "--gguf-format", "Q8_0",
            "--first-chunk-tokens", "4", "--no-reflection", "--voices-dir", "/v", "--log-level",
            "DEBUG", "--http-port", "8000", "--lexicon", "a/nav.pls", "--lexicon", "brands.pls",
        ]
    )  # fmt: skip
    assert cfg.engine.max_streams == 3 and cfg.admission.grace_s == 1.5
    assert cfg.model.model_dir == Path("/models/x") and cfg.model.allow_unverified
    assert not cfg.engine.warmup and not cfg.engine.cuda_graphs and not cfg.security.reflection
    assert cfg.model.gguf_format == "Q8_0" and cfg.engine.first_chunk_tokens == 4
    assert cfg.voices_dir == Path("/v") and cfg.log_level == "DEBUG"
    assert cfg.network.http_port == 8000 and cfg.engine.max_chunk_tokens == 32
    assert cfg.lexicon == (Path("a/nav.pls"), Path("brands.pls"))  # repeated, in order


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-streams", "0"], "--max-streams must be in [1, 1024]"),
        (["--port", "70000"], "--port must be in [0, 65535]"),
        (["--keepalive-time-s", "0.5"], "--keepalive-time-s must be >= 1"),
        (["--lookahead-tokens", "129"], "--lookahead-tokens must be in [0, 128]"),
        (["--first-chunk-tokens", "40"], "--first-chunk-tokens must leave first_chunk_tokens (40)"),
        (["--max-new-tokens", "2000"], "--max-new-tokens must be < --max-tokens"),
        (["--max-stream-chars", "10"], "--max-stream-chars must be >= --max-text-chars"),
        (["--vocoder", "hifigan"], "--vocoder hifigan needs --hifigan-checkpoint"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key must be given together"),
        (["--http-port", "50051"], "--http-port must differ from --port"),
        (["--reserved-slots", "16"], "--reserved-slots must be < --max-streams"),
        (["--lexicon", "a/nav.pls", "--lexicon", "b/nav"], "--lexicon: two files are named nav"),
        (["--model", "a/b", "--model-dir", "/m"], "--model and --model-dir are two sources"),
        (["--model", "ChatTTS"], "--model must be REPO[@REVISION] like 2Noise/ChatTTS"),
        (["--model", "a/b/c"], "--model must be REPO[@REVISION]"),
        (["--dev-model-fallback"], "--dev-model-fallback needs --model"),
        (["--download-only"], "--download-only needs --model"),
        (["--model", "a/b", "--download-only", "--dev-model-fallback"], "no --dev-model-fallback"),
    ],
)
def test_bounds_and_rules_between_fields_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(argv)
    assert message in str(info.value)


def test_the_hub_flags_map_to_the_model_section() -> None:
    cfg = config_from_args(
        ["--model", "2Noise/ChatTTS@main", "--dev-model-fallback", "--hub-timeout-s", "3"]
        + ["--sha256-map", "m.json"]
    )
    assert cfg.model.model == "2Noise/ChatTTS@main" and cfg.model.dev_model_fallback
    assert cfg.model.hub_timeout_s == 3 and cfg.model.sha256_map == Path("m.json")
    assert not cfg.download_only and not cfg.model.model_dir_checked
    assert config_from_args(["--model", "a/b", "--download-only"]).download_only


def test_configs_built_in_code_are_checked_the_same_way() -> None:
    with pytest.raises(ConfigError, match="--max-streams must be in"):
        ServerConfig(engine=EngineConfig(max_streams=5000)).validate()
    with pytest.raises(ConfigError, match="--dev-model must be one of tiny, full"):
        ServerConfig(model=ModelConfig(dev_model="huge")).validate()

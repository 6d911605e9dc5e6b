"""chattts_client's default service config and keepalive: what the README gives other languages
is what the library sets, and both can be turned off. (Their effect on real replicas:
tests/e2e/test_haproxy_replicas.py and tests/e2e/test_client_keepalive.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from chattts_client import TTSClient
from chattts_client.resilience import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS, SERVICE_CONFIG

README = Path(__file__).resolve().parents[2] / "docs" / "replicas.md"


def _options(client: TTSClient) -> dict[str, object]:
    return dict(client._spec.options)


def test_readme_json_is_the_library_service_config() -> None:
    section = README.read_text()
    (block,) = re.findall(r"```json\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert json.loads(block) == SERVICE_CONFIG
    assert f"`grpc.keepalive_time_ms` {KEEPALIVE_TIME_MS}" in section
    assert f"`grpc.keepalive_timeout_ms` {KEEPALIVE_TIMEOUT_MS}" in section
    assert f"`grpc.http2.ping_timeout_ms` {KEEPALIVE_TIMEOUT_MS}" in section


def test_service_config_retries_unavailable_and_a_cut_call_on_every_method() -> None:
    (method,) = SERVICE_CONFIG["methodConfig"]
    service = "chattts.v1.TextToSpeech"
    assert method["name"] == [
        {"service": service, "method": "Synthesize"},
        {"service": service, "method": "StreamingSynthesize"},
        {"service": service, "method": "ListVoices"},
    ]
    # UNKNOWN: a proxy's answer for a stream it cut; CANCELLED: grpc's server core answer for a
    # stream that raced a drain's GOAWAY. grpc retries only calls not yet answered.
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "UNKNOWN", "CANCELLED"]
    assert SERVICE_CONFIG["loadBalancingConfig"] == [{"round_robin": {}}]


def test_defaults_set_both_and_each_can_be_turned_off() -> None:
    with TTSClient("127.0.0.1:1") as client:
        options = _options(client)
    assert json.loads(str(options["grpc.service_config"])) == SERVICE_CONFIG
    assert options["grpc.enable_retries"] == 1
    assert options["grpc.keepalive_time_ms"] == KEEPALIVE_TIME_MS
    with TTSClient("127.0.0.1:1", service_config=None, keepalive=False) as client:
        options = _options(client)
    assert "grpc.service_config" not in options and options["grpc.enable_retries"] == 0
    assert "grpc.keepalive_time_ms" not in options

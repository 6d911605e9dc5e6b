"""The server without PyAV (the `av` package, which the GPU check does not carry): it starts,
serves the sample encodings and WAV, and at every door refuses each format PyAV encodes (Ogg
Opus, MP3, AAC, FLAC) up front with the same clear error naming the field: gRPC
INVALID_ARGUMENT, POST 400, WebSocket an error message and close 1007. The one capability check
(`audio.encoding.available_encodings`) is what every door validates against.

PyAV is installed here, so each check runs in a subprocess whose `sitecustomize` wraps every
finder on `sys.meta_path` so that none finds `av` or `av.*`: `importlib.util.find_spec("av")`
returns None (transformers asks that at import) and `import av` raises ModuleNotFoundError,
as on a machine without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import httpx2
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chattts_devtools import launcher
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from serverutil import bad_request_field

REPO = Path(__file__).resolve().parents[2]
DEV_MODEL_CACHE = REPO / ".cache" / "dev-models"

BLOCKER = textwrap.dedent(
    """
    import sys


    class _WithoutPyAV:
        \"\"\"Wraps a finder; finds nothing for av and av.*, as when it is not installed.\"\"\"

        def __init__(self, finder):
            self._finder = finder

        def find_spec(self, name, path=None, target=None):
            if name == "av" or name.startswith("av."):
                return None
            return self._finder.find_spec(name, path, target)

        def __getattr__(self, attr):
            return getattr(self._finder, attr)


    sys.meta_path[:] = [_WithoutPyAV(finder) for finder in sys.meta_path]
    """
)


@pytest.fixture(scope="module")
def no_pyav_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("no_pyav")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return str(folder)


def _env_with(no_pyav_path: str) -> dict[str, str]:
    """This checkout's packages importable, and the blocker's sitecustomize found."""
    env = launcher.server_env()
    env["PYTHONPATH"] = os.pathsep.join([no_pyav_path, env["PYTHONPATH"]])
    return env


def test_pyav_is_installed_here_so_the_blocker_is_what_hides_it() -> None:
    import av  # noqa: F401 - the premise of this file: without the blocker it imports

    from chattts_server.audio import encoding

    assert "OGG_OPUS" in encoding.available_encodings()


def test_the_server_package_imports_without_pyav_and_refuses_what_needs_it(
    no_pyav_path: str,
) -> None:
    script = textwrap.dedent(
        """
        import importlib.util, sys
        try:
            import av
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("the blocker did not hide PyAV")
        assert importlib.util.find_spec("av") is None
        import chattts_server.main, chattts_server.server, chattts_server.stream.stream
        from chattts_server.audio.containers import CONTAINER_ENCODINGS
        import chattts_server.audio.opus  # its rate table is there without PyAV
        from chattts_server.audio.encoding import (
            SUPPORTED_ENCODINGS, EncodingUnavailable, available_encodings, make_encoder,
        )
        assert "av" not in sys.modules, "something imported PyAV at start-up"
        served = available_encodings(SUPPORTED_ENCODINGS + CONTAINER_ENCODINGS)
        assert set(served) == {"LINEAR16", "MULAW", "ALAW", "FLOAT32", "WAV"}, served
        chunk = make_encoder("LINEAR16", 16000, 24000).encode(__import__("numpy").zeros(2400, "f4"))
        assert len(chunk.data) == 2 * chunk.num_samples > 0
        try:
            make_encoder("OGG_OPUS", 24000, 24000)
        except EncodingUnavailable as exc:
            print("refused:", exc)
        else:
            raise SystemExit("OGG_OPUS encoder made without PyAV")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env_with(no_pyav_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused: OGG_OPUS needs PyAV" in done.stdout
    # logged once by the capability check
    assert (
        "OGG_OPUS is off: it needs PyAV (the av package), which is not installed; "
        "so are MP3, AAC, FLAC" in done.stderr
    )


PYAV_FORMATS = {"opus": "OGG_OPUS", "mp3": "MP3", "aac": "AAC", "flac": "FLAC"}
SAMPLING = {"seed": 1, "min_new_tokens": 8, "max_new_tokens": 8}


def _grpc(target: str, encoding: int) -> list[tts_pb2.SynthesizeResponse]:
    config = tts_pb2.SynthesisConfig(
        audio_format=tts_pb2.AudioFormat(encoding=encoding, sample_rate_hz=24000),
        sampling=tts_pb2.Sampling(**SAMPLING),
    )
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(text="No PyAV here.", config=config)
        return list(stub.Synthesize(request, timeout=60))


def _post(url: str, response_format: str) -> httpx2.Response:
    body = {"input": "No PyAV here.", "response_format": response_format}
    return httpx2.post(url + "/v1/audio/speech", json=body | {"chattts": {"sampling": SAMPLING}})


def _ws(url: str, audio_format: str) -> tuple[list[bytes | dict], int | None]:
    events: list[bytes | dict] = []
    with connect(url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "config", "audio_format": audio_format, "sampling": SAMPLING}))
        try:  # a refused config closes the socket, maybe before these go out
            ws.send(json.dumps({"type": "text", "text": "No PyAV here."}))
            ws.send(json.dumps({"type": "end"}))
        except ConnectionClosed:
            pass
        try:
            while True:
                message = ws.recv(timeout=60)
                events.append(message if isinstance(message, bytes) else json.loads(message))
        except ConnectionClosed:
            return events, ws.close_code


@pytest.mark.slow
def test_every_door_refuses_every_pyav_format_the_same_way(
    no_pyav_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", no_pyav_path)  # launcher.server_env appends it
    args = ["--max-streams", "2"]
    with launcher.launch(args, dev_model="tiny", cache=DEV_MODEL_CACHE, http=True) as srv:
        srv.wait_serving(120)
        url = srv.http_url
        # What needs no PyAV is served at every door.
        replies = _grpc(srv.target, tts_pb2.LINEAR16)
        assert sum(len(r.audio.audio) for r in replies if r.HasField("audio")) > 0
        assert _post(url, "wav").content[:4] == b"RIFF"
        events, code = _ws(url, "pcm")
        assert code == 1000 and any(isinstance(e, bytes) for e in events)

        with pytest.raises(grpc.RpcError) as refused:
            _grpc(srv.target, tts_pb2.OGG_OPUS)  # the one PyAV encoding in tts.proto
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_field(refused.value) == "config.audio_format.encoding"
        assert "OGG_OPUS is not available on this server: it needs PyAV" in (
            refused.value.details() or ""
        )
        for name, encoding in PYAV_FORMATS.items():
            why = f"{name} ({encoding}) is not available on this server: it needs PyAV"
            r = _post(url, name)
            assert r.status_code == 400, (name, r.text)
            error = r.json()["error"]
            assert error["param"] == "response_format" and why in error["message"], error
            events, code = _ws(url, name)
            assert code == 1007, (name, events)
            (error_event,) = [e for e in events if isinstance(e, dict)]
            error = error_event["error"]
            assert error["param"] == "config.audio_format" and why in error["message"], error
        srv.stop()
    log = srv.log_text()
    assert "OGG_OPUS is off: it needs PyAV" in log and "so are MP3, AAC, FLAC" in log
    assert "Traceback" not in log and "Exception in ASGI" not in log

"""The server without PyAV (the `av` package, which the GPU check does not carry): it starts,
serves the sample encodings, and refuses OGG_OPUS with INVALID_ARGUMENT naming the encoding.

PyAV is installed here, so each check runs in a subprocess whose `sitecustomize` wraps every
finder on `sys.meta_path` so that none finds `av` or `av.*`: `importlib.util.find_spec("av")`
returns None (transformers asks that at import) and `import av` raises ModuleNotFoundError,
as on a machine without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest

from chattts_devtools import launcher
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

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
    # The blocker first, then this checkout's server (not whatever is installed).
    env = launcher.server_env()
    env["PYTHONPATH"] = os.pathsep.join([no_pyav_path, env["PYTHONPATH"]])
    return env


def test_pyav_is_installed_here_so_the_blocker_is_what_hides_it() -> None:
    import av  # noqa: F401 - the premise of this file: without the blocker it imports

    from chattts_server.audio import encoding

    assert "OGG_OPUS" in encoding.available_encodings()


def test_the_server_package_imports_without_pyav_and_refuses_ogg_opus(no_pyav_path: str) -> None:
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
        import chattts_server.main, chattts_server.server, chattts_server.api.session
        import chattts_server.audio.opus  # its rate table is there without PyAV
        from chattts_server.audio.encoding import (
            EncodingUnavailable, available_encodings, make_encoder,
        )
        assert "av" not in sys.modules, "something imported PyAV at start-up"
        assert "OGG_OPUS" not in available_encodings(), available_encodings()
        assert "LINEAR16" in available_encodings()
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
    assert "OGG_OPUS is off: it needs PyAV" in done.stderr  # logged by available_encodings


@pytest.mark.slow
def test_a_server_without_pyav_serves_linear16_and_refuses_ogg_opus(
    no_pyav_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", no_pyav_path)  # launcher.server_env appends it
    with launcher.launch(["--max-streams", "2"], dev_model="tiny", cache=DEV_MODEL_CACHE) as srv:
        srv.wait_serving(120)
        with grpc.insecure_channel(srv.target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)

            def synthesize(encoding: int) -> list[tts_pb2.SynthesizeResponse]:
                config = tts_pb2.SynthesisConfig(
                    audio_format=tts_pb2.AudioFormat(encoding=encoding, sample_rate_hz=24000),
                    sampling=tts_pb2.Sampling(seed=1, min_new_tokens=8, max_new_tokens=8),
                )
                request = tts_pb2.SynthesizeRequest(text="No PyAV here.", config=config)
                return list(stub.Synthesize(request, timeout=60))

            replies = synthesize(tts_pb2.LINEAR16)
            assert sum(len(r.audio.audio) for r in replies if r.HasField("audio")) > 0
            with pytest.raises(grpc.RpcError) as refused:
                synthesize(tts_pb2.OGG_OPUS)
        srv.stop()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "OGG_OPUS" in details and "audio_format.encoding" in details, details
    assert "OGG_OPUS is off: it needs PyAV" in srv.log_text()

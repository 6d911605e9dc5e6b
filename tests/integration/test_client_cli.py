"""The client's WAV writer and its CLI (`say`, `voices`) against a fake in-process
TextToSpeech servicer (tests/helpers/fake_tts.py)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from chattts_client import WavWriter, pcm16_to_float
from chattts_client.cli import main
from fake_tts import CHUNK_SAMPLES, EXPECTED_PCM, NUM_CHUNKS, SAMPLE_RATE_HZ, TOKEN

# --- WAV ------------------------------------------------------------------------------------


class UnseekableBytesIO(io.BytesIO):
    """Behaves like a pipe: write-only forward, no seek or tell."""

    def seekable(self) -> bool:
        return False

    def seek(self, *args):  # type: ignore[no-untyped-def]
        raise io.UnsupportedOperation("seek")

    def tell(self):  # type: ignore[no-untyped-def]
        raise io.UnsupportedOperation("tell")


def _write_in_odd_pieces(writer: WavWriter) -> None:
    # Piece boundaries fall inside samples: the writer must carry the odd byte over.
    for start in range(0, len(EXPECTED_PCM), 1001):
        writer.write(EXPECTED_PCM[start : start + 1001])


def _assert_expected_wav(data: bytes | str) -> None:
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    info = sf.info(source)
    assert (info.samplerate, info.channels, info.frames) == (
        SAMPLE_RATE_HZ,
        1,
        NUM_CHUNKS * CHUNK_SAMPLES,
    )
    if isinstance(source, io.BytesIO):
        source.seek(0)
    samples, _ = sf.read(source, dtype="int16")
    assert samples.tobytes() == EXPECTED_PCM


def test_wav_writer_to_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "out.wav"
    with WavWriter(path, SAMPLE_RATE_HZ) as writer:
        _write_in_odd_pieces(writer)
    assert writer.num_frames == NUM_CHUNKS * CHUNK_SAMPLES
    assert path.stat().st_size == 44 + len(EXPECTED_PCM)
    _assert_expected_wav(str(path))


def test_wav_writer_to_seekable_file_object() -> None:
    buf = io.BytesIO()
    with WavWriter(buf, SAMPLE_RATE_HZ) as writer:
        _write_in_odd_pieces(writer)
    assert not buf.closed  # a caller's file is left open
    _assert_expected_wav(buf.getvalue())


def test_wav_writer_to_unseekable_stream_writes_streaming_header() -> None:
    pipe = UnseekableBytesIO()
    writer = WavWriter(pipe, SAMPLE_RATE_HZ)
    assert len(pipe.getvalue()) == 44  # header out before any audio
    _write_in_odd_pieces(writer)
    assert len(pipe.getvalue()) == 44 + len(EXPECTED_PCM)  # audio out as it comes
    writer.close()
    data = pipe.getvalue()
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    _assert_expected_wav(data)


def test_pcm16_to_float() -> None:
    pcm = np.array([0, 16384, -32768, 32767], dtype="<i2").tobytes()
    out = pcm16_to_float(pcm)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.5, -1.0, 32767 / 32768])


# --- CLI ------------------------------------------------------------------------------------


def test_cli_say_writes_wav_and_prints_timings(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    out = tmp_path / "hello.wav"
    argv = ["say", "Hello.", "-o", str(out), "--server", target, "--voice", "alice"]
    argv += ["--speed", "4", "--seed", "3", "--token-file", str(token_file), "--timeout", "10"]
    assert main(argv) == 0
    _assert_expected_wav(str(out))
    err = capsys.readouterr().err
    assert "time to first audio:" in err and " ms" in err
    assert "real-time factor:" in err and "chunks: 3" in err and "audio: 0.300 s" in err
    request = servicer.synthesize_requests[0]
    assert request.text == "Hello." and request.config.voice.preset == "alice"
    assert request.config.prosody.speed == 4 and request.config.sampling.seed == 3
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"


def test_cli_say_stdin_streams_lines_to_stdout(fake, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    stdout = io.TextIOWrapper(UnseekableBytesIO())
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n\n   \ntwo\n"))
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["say", "--stdin", "-o", "-", "--server", target]) == 0
    data = stdout.buffer.getvalue()  # type: ignore[attr-defined]
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SAMPLE_RATE_HZ and samples.tobytes() == EXPECTED_PCM * 2
    texts = [(r.text.text, r.text.flush) for r in servicer.stream_requests[1:]]
    assert texts == [("one\n", True), ("two\n", True)]  # blank lines are not sent
    err = capsys.readouterr().err
    assert "utterance 0:" in err and "utterance 1:" in err and "'two" in err
    assert "real-time factor:" in err


def test_cli_maps_server_error_to_exit_2(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    out = tmp_path / "x.wav"
    assert main(["say", "fail", "-o", str(out), "--server", target]) == 2
    err = capsys.readouterr().err
    assert "error: INVALID_ARGUMENT: text: rejected by fake" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_cli_usage_errors_exit_2(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    out = str(tmp_path / "x.wav")
    assert main(["say", "-o", out, "--server", target]) == 2  # neither text nor --stdin
    assert main(["say", "hi", "-o", out, "--server", target, "--voice", "seed:x"]) == 2
    assert "error: voice: bad seed" in capsys.readouterr().err


def test_cli_voices(fake, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    assert main(["voices", "--server", target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["alice  calm, female", "bob    fast, male"]

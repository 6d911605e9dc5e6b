"""The client's timeline against the real server (tiny random-weight model, estimated word
timing): `chattts-client say --subtitles`, `voices` on a server with no presets, and what was
heard after a barge-in, from the library."""

from __future__ import annotations

import io
import threading

import pytest
import soundfile as sf

from chattts_client import (
    AudioChunkEvent,
    Clear,
    Mark,
    MarkEvent,
    Timeline,
    TTSClient,
    make_config,
)
from chattts_client.cli import main
from subtitle_files import demux_cues, read_cues

TEXT = "In 200 m, turn left. Then keep right at the fork."
# Audio tokens per sentence, exactly: the random-weight model would otherwise stop anywhere.
TOKENS = ["--min-new-tokens", "40", "--max-new-tokens", "40"]
CALL_TIMEOUT_S = 60.0


def test_voices_on_a_server_with_no_presets_says_so(server, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["voices", "--server", server.target]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the list (empty) for scripts that read it
    assert "no presets on this server" in captured.err


@pytest.mark.parametrize("suffix", [".vtt", ".srt"])
def test_say_writes_captions_in_the_callers_text(server, tmp_path, capsys, suffix) -> None:  # type: ignore[no-untyped-def]
    wav, captions = tmp_path / "turn.wav", tmp_path / f"turn{suffix}"
    argv = ["say", TEXT, "-o", str(wav), "--subtitles", str(captions), "--server", server.target]
    assert main([*argv, *TOKENS, "--seed", "3"]) == 0
    assert "word timing: TIMING_ESTIMATE" in capsys.readouterr().err
    cues = read_cues(captions)
    # Written as sent ("200 m", not "two hundred meters"), every word once, in order.
    assert " ".join(text for _, _, text in cues) == TEXT
    # ffmpeg's demuxer reads the same cues.
    assert [(start, duration) for start, duration, _ in demux_cues(captions)] == [
        (round(start * 1000), round(end * 1000) - round(start * 1000)) for start, end, _ in cues
    ]
    audio_s = sf.info(str(wav)).duration
    assert all(0 <= start < end <= audio_s + 0.01 for start, end, _ in cues)
    assert all(b[0] >= a[1] for a, b in zip(cues, cues[1:], strict=False))


def test_say_stdin_captions_each_line(server, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", io.StringIO("In 200 m, turn left.\n\nThen keep right.\n"))
    wav, captions = tmp_path / "lines.wav", tmp_path / "lines.srt"
    argv = ["say", "--stdin", "-o", str(wav), "--subtitles", str(captions)]
    assert main([*argv, "--server", server.target, *TOKENS, "--seed", "3"]) == 0
    texts = [text for _, _, text in read_cues(captions)]
    assert " ".join(texts) == "In 200 m, turn left. Then keep right."
    assert "subtitles: " in capsys.readouterr().err


def test_say_stdin_with_max_lag_skips_what_falls_too_far_behind(
    server, tmp_path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Ten caption lines at once (a feed that stalled, then flushed), each about 0.85 s of
    audio, under a 1 s lag limit: the listener would fall behind, so the oldest lines are
    skipped, each reported, and the newest is spoken."""
    lines = "".join(f"caption line number {k} goes here\n" for k in range(10))
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    wav = tmp_path / "captions.wav"
    argv = ["say", "--stdin", "-o", str(wav), "--max-lag-s", "1"]
    assert main([*argv, "--server", server.target, *TOKENS, "--seed", "3"]) == 0
    err = capsys.readouterr().err
    reported = [line for line in err.splitlines() if line.startswith("utterance ")]
    assert len(reported) == 10
    assert any(", skipped, lag " in line for line in reported), err
    assert "skipped" not in reported[-1], err


def test_a_subtitles_name_without_a_known_extension_is_a_usage_error(
    server, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "x.wav"
    argv = ["say", "Hi.", "-o", str(out), "--subtitles", str(tmp_path / "x.txt")]
    assert main([*argv, "--server", server.target]) == 2
    assert ".vtt (WebVTT) or .srt" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was spoken


def test_heard_text_after_a_barge_in_on_a_real_stream(server) -> None:  # type: ignore[no-untyped-def]
    """Clear while the first text plays, then a mark after the new text: at the mark (all audio
    played) the text heard ends with the new text, and cut at each word's end it ends with that
    word's own text."""
    first = "In 200 m, turn left onto Main Street. Then keep right at the fork. "
    audio_started = threading.Event()
    timeline = Timeline()
    offsets: dict[str, int] = {}

    def items():  # type: ignore[no-untyped-def]
        yield first
        if not audio_started.wait(CALL_TIMEOUT_S):
            raise TimeoutError("no audio before the barge-in")
        offsets["clear"] = timeline.num_sent_chars
        yield Clear("Rerouting. ")
        yield Mark("rerouted")

    config = make_config(word_timing=True, max_new_tokens=200, seed=5)
    with TTSClient(server.target) as client:
        for event in client.stream(timeline.track(items()), config=config, timeout=CALL_TIMEOUT_S):
            timeline.observe(event)
            if isinstance(event, AudioChunkEvent):
                audio_started.set()
    (mark,) = timeline.marks
    assert isinstance(mark, MarkEvent) and mark.name == "rerouted" and not mark.dropped
    assert timeline.heard_text(0) == ""
    assert timeline.heard_text(mark.sample_offset).endswith("Rerouting.")
    assert timeline.heard_text(mark.sample_offset, since=offsets["clear"]) == "Rerouting."
    words = [w for u in timeline.ordered_utterances() for w in u.ordered_words()]
    assert words and all(w.has_source for w in words)
    for word, following in zip(words, [*words[1:], None], strict=True):
        if following is not None and following.source_start < word.source_end:
            continue  # "200 m" spoken as three words: heard once the last of them is
        assert timeline.heard_text(word.end_sample).endswith(word.source_text), word

"""`chattts-client`: speak text through a chattts-stream server, or list its voices.

    chattts-client say "Hello there." -o hello.wav
    chattts-client say --stdin -o - | aplay        # speaks each line as it is typed
    chattts-client say "Hello there." -o hello.wav --subtitles hello.vtt   # or .srt
    chattts-client say "Take I-95." -o nav.wav --lexicon my.pls --lexicon nav   # file or name
    chattts-client voices

Exit status: 0 ok, 1 local error (file, certificate), 2 usage or gRPC error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

import grpc

from chattts_client.calls import EventStream, SynthesisStats
from chattts_client.channel import DEFAULT_TARGET
from chattts_client.client import TTSClient
from chattts_client.config import lexicon_value, make_config
from chattts_client.messages import MODEL_SAMPLE_RATE_HZ, AudioChunkEvent, UtteranceEndEvent
from chattts_client.subtitles import cues, subtitle_format, write_subtitles
from chattts_client.timeline import Timeline
from chattts_client.wav import WavWriter
from chattts_proto.chattts.v1 import tts_pb2

_ENCODINGS = ("linear16", "mulaw", "alaw", "ogg_opus", "float32")


class _UsageError(Exception):
    pass


def _connection_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--server", default=DEFAULT_TARGET, help=f"host:port (default {DEFAULT_TARGET})")
    g.add_argument("--tls", action="store_true", help="use TLS (implied by --ca/--cert)")
    g.add_argument("--ca", metavar="FILE", help="CA certificate (PEM); default: system roots")
    g.add_argument("--cert", metavar="FILE", help="client certificate (PEM) for mutual TLS")
    g.add_argument("--key", metavar="FILE", help="client private key (PEM) for mutual TLS")
    g.add_argument("--tls-server-name", metavar="NAME", help="name to check in the server cert")
    tok = g.add_mutually_exclusive_group()
    tok.add_argument("--token", help="bearer token")
    tok.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    g.add_argument("--timeout", type=float, metavar="S", help="deadline of the call in seconds")
    return p


def build_parser() -> argparse.ArgumentParser:
    conn = _connection_parser()
    parser = argparse.ArgumentParser(
        prog="chattts-client", description="Client for the chattts-stream TTS server."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    say = sub.add_parser(
        "say",
        parents=[conn],
        help="speak text",
        description="Speak TEXT (Synthesize), or each line of stdin as it arrives "
        "(StreamingSynthesize, --stdin). Timings go to stderr.",
    )
    say.add_argument("text", nargs="?", help="text to speak")
    say.add_argument(
        "--stdin", action="store_true", help="speak standard input line by line as it arrives"
    )
    say.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="output file, '-' for stdout; WAV for linear16, raw encoded bytes otherwise",
    )
    say.add_argument("--voice", help="seed:N, N, preset:NAME, NAME or emb:STRING")
    say.add_argument(
        "--reference",
        metavar="FILE",
        help="zero-shot voice: a short clip (WAV/FLAC/Ogg) of the speaker",
    )
    say.add_argument("--transcript", default="", help="what is said in --reference")
    say.add_argument("--speed", type=float, help="speed level 0..9")
    say.add_argument("--refine", action="store_true", help="run ChatTTS refine-text first")
    say.add_argument("--temperature", type=float)
    say.add_argument("--top-p", type=float)
    say.add_argument("--top-k", type=int)
    say.add_argument("--seed", type=int, help="sampling seed")
    say.add_argument(
        "--max-new-tokens", type=int, metavar="N", help="audio tokens per sentence, at most"
    )
    say.add_argument(
        "--min-new-tokens", type=int, metavar="N", help="audio tokens per sentence, at least"
    )
    say.add_argument("--encoding", default="linear16", choices=_ENCODINGS, type=str.lower)
    say.add_argument("--sample-rate", type=int, default=0, metavar="HZ", help="0: native")
    say.add_argument(
        "--subtitles",
        metavar="FILE",
        help="also write captions from the server's word timing: WebVTT (.vtt) or SRT (.srt)",
    )
    say.add_argument(
        "--lexicon",
        action="append",
        default=[],
        metavar="FILE_OR_NAME",
        help="a pronunciation lexicon: a W3C PLS file (sent inline) or the name of one the "
        "server loaded; repeat for several, the later winning for the same word",
    )

    say.add_argument(
        "--max-lag-s",
        type=float,
        metavar="S",
        help="with --stdin (live captions): keep the lag under S seconds, speaking faster "
        "past it and skipping whole sentences past twice it",
    )

    sub.add_parser("voices", parents=[conn], help="list the server's voices")
    return parser


def _client(args: argparse.Namespace) -> TTSClient:
    token = args.token
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
    return TTSClient(
        args.server,
        tls=args.tls or bool(args.ca or args.cert or args.key),
        ca_cert=args.ca,
        client_cert=args.cert,
        client_key=args.key,
        token=token,
        tls_server_name=args.tls_server_name,
    )


def _stdin_lines(stdin: TextIO) -> Iterator[str]:
    # readline, not iteration with read-ahead, so each line goes out as soon as it is typed.
    # Each line keeps its newline: markdown (an LLM's reply piped in) is read by lines, and a
    # line sent without one would run on into the next. Blank lines add nothing to a flushed
    # line, so they are not sent.
    while line := stdin.readline():
        if line.strip():
            yield line.rstrip("\r\n") + "\n"


class _AudioSink:
    """Writes audio events to a file or stdout: WAV for LINEAR16, raw bytes otherwise."""

    def __init__(self, output: str, encoding: str, stdout: BinaryIO) -> None:
        self._output = output
        self._wav = encoding == "linear16"
        self._stdout = stdout
        self._file: BinaryIO | None = None
        self._writer: WavWriter | None = None

    def _target(self) -> BinaryIO:
        if self._file is None:
            self._file = self._stdout if self._output == "-" else open(self._output, "wb")  # noqa: SIM115
        return self._file

    def write(self, chunk: AudioChunkEvent) -> None:
        if not self._wav:
            f = self._target()
            f.write(chunk.audio)
            f.flush()
            return
        if self._writer is None:
            # The WAV header needs the rate, which the first chunk tells.
            target = self._stdout if self._output == "-" else self._output
            self._writer = WavWriter(target, chunk.sample_rate_hz or MODEL_SAMPLE_RATE_HZ)
        self._writer.write(chunk.audio)

    def close(self, sample_rate_hz: int, create_empty: bool) -> None:
        """Finish the output; with no audio, write an empty one only if `create_empty`."""
        if create_empty and self._wav and self._writer is None:
            target = self._stdout if self._output == "-" else self._output
            self._writer = WavWriter(target, sample_rate_hz or MODEL_SAMPLE_RATE_HZ)
        if create_empty and not self._wav:
            self._target()
        if self._writer is not None:
            self._writer.close()
        if self._file is not None and self._file is not self._stdout:
            self._file.close()
        elif self._file is not None:
            self._file.flush()


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _print_summary(stats: SynthesisStats, err: TextIO) -> None:
    print(f"time to first audio: {_fmt(stats.ttfa_ms, '.0f')} ms", file=err)
    print(f"total time: {stats.total_s:.3f} s", file=err)
    print(f"audio: {stats.audio_s:.3f} s", file=err)
    print(f"real-time factor: {_fmt(stats.rtf, '.3f')}", file=err)
    print(f"chunks: {stats.num_chunks}", file=err)


def _print_utterance(end: UtteranceEndEvent, stats: SynthesisStats, err: TextIO) -> None:
    rtf = end.generation_time_s / end.audio_duration_s if end.audio_duration_s > 0 else None
    print(
        f"utterance {end.utterance_index}: {end.audio_duration_s:.2f} s audio, "
        f"server ttfa {end.time_to_first_audio_s * 1000:.0f} ms, "
        f"generated in {end.generation_time_s:.2f} s (rtf {_fmt(rtf, '.2f')}), "
        f"{end.num_tokens} tokens, {end.finish_reason or '-'}, "
        f"lag {end.lag_s:.2f} s, speed {end.speed}, "
        f"ended at {stats.total_s:.2f} s: {end.text!r}",
        file=err,
        flush=True,
    )


def _config(args: argparse.Namespace) -> tts_pb2.SynthesisConfig:
    config = make_config(
        voice=args.voice,
        speed=args.speed,
        refine_text=args.refine,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        encoding=args.encoding,
        sample_rate_hz=args.sample_rate,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        reference_audio=Path(args.reference).read_bytes() if args.reference else None,
        reference_transcript=args.transcript,
        word_timing=bool(args.subtitles),
        max_lag_s=args.max_lag_s,
    )
    config.lexicons.extend(lexicon_value(value) for value in args.lexicon)
    return config


def _say(args: argparse.Namespace, stdin: TextIO, stdout: BinaryIO, err: TextIO) -> int:
    if args.stdin == (args.text is not None):
        raise _UsageError("say needs either TEXT or --stdin")
    if args.subtitles:
        subtitle_format(args.subtitles)  # a bad name fails before anything is spoken
    config = _config(args)
    sink = _AudioSink(args.output, args.encoding, stdout)
    timeline = Timeline("" if args.stdin else args.text)
    with _client(args) as client:
        events: EventStream
        if args.stdin:
            events = client.stream(
                timeline.track(_stdin_lines(stdin)),
                config=config,
                flush_each=True,
                timeout=args.timeout,
            )
        else:
            events = client.synthesize(args.text, config=config, timeout=args.timeout)
        # Leaving early (error, Ctrl-C, broken pipe) cancels the call; audio received so far
        # is kept in a finished file, and so are its captions.
        with events:
            completed = False
            try:
                for event in events:
                    timeline.observe(event)
                    if isinstance(event, AudioChunkEvent):
                        sink.write(event)
                    elif isinstance(event, UtteranceEndEvent) and args.stdin:
                        _print_utterance(event, events.stats, err)
                completed = True
            finally:
                sink.close(args.sample_rate, create_empty=completed)
                if args.subtitles:
                    _write_subtitles(args.subtitles, timeline, err)
    _print_summary(events.stats, err)
    return 0


def _write_subtitles(path: str, timeline: Timeline, err: TextIO) -> None:
    cue_list = cues(timeline)
    write_subtitles(path, cue_list)
    source = timeline.timing_source or "none from the server: one cue per utterance"
    print(f"subtitles: {len(cue_list)} cues in {path} (word timing: {source})", file=err)


def _voices(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    with _client(args) as client:
        voices = client.list_voices(timeout=args.timeout)
    if not voices:
        # On stderr: stdout stays the list (empty) for scripts that read it.
        print("no presets on this server (a voice is still any seed:N or emb:STRING)", file=err)
        return 0
    width = max((len(v.name) for v in voices), default=0)
    for v in voices:
        print(f"{v.name:<{width}}  {v.description}".rstrip(), file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    err = sys.stderr
    try:
        if args.command == "say":
            return _say(args, sys.stdin, sys.stdout.buffer, err)
        return _voices(args, sys.stdout, err)
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else None
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        print(f"error: {code.name if code else 'UNKNOWN'}: {details}", file=err)
        return 2
    except (_UsageError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    except BrokenPipeError:
        # The reader (e.g. aplay) went away: stop quietly, like other Unix filters, and point
        # stdout at /dev/null so the flush at interpreter exit does not fail again.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:
        print(f"error: {e}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

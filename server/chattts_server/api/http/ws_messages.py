"""The WebSocket's messages, read into the stream's terms (websocket.py serves the socket).

Messages (text frames are JSON objects with a `type`; docs/api.md "WebSocket" has examples):

client -> server
  {"type": "config", ...}   first, once: the fields of tts.proto's SynthesisConfig in their
                            JSON form (`voice`, `audio_format`, `prosody`, `sampling`,
                            `text_release`, ...); `voice` may also be a string as on the
                            speech route (preset, `seed:N`, OpenAI name), `audio_format` may
                            be a `response_format` string (`pcm`, `wav`, `opus`, `mp3`,
                            `flac`, `aac`) or tts.proto's object (default LINEAR16 at the
                            model's rate).
  {"type": "text", "text": "...", "flush": false, "clear": false}
                            a fragment of text (TextInput); `flush` speaks what is buffered,
                            `clear` is barge-in (drop the buffer, stop the utterance being
                            spoken, speak what follows).
                            `"mark": "name"` places a mark after the text (TextInput.mark).
                            `"segment": "name"` names the text as a segment (TextInput
                            .segment), `"expires_in_ms": N` gives it a time to start.
  {"type": "replace", "segment": "name", "text": "...", "if_started": "cut",
   "expires_in_ms": 0}      replace a segment's text (TextInput.replace); `if_started` is
                            "finish" (the default), "cut" or "drop_new".
  {"type": "flush"} / {"type": "clear"}   the same without text.
  {"type": "mark", "name": "..."}         a mark without text.
  {"type": "end"}           no more text: speak what is buffered, then the server closes.
  {"type": "cancel"}        end a resumable stream now (it is not held for a resume).
  Text, replace, flush, clear and mark messages may carry `"seq": N` (1, 2, ...): on a
  resumable stream each is applied once, so a client that resumes sends again those after the
  `text_seq` it is told.

A resumable stream (`"resumable": true` in the config, with --resume-window-s on) outlives its
socket as a gRPC one does (api/resume.py): its first message is {"type": "stream", "stream_id",
"resume_token", "resume_window_s", "text_seq"}. A new socket whose first message is
  {"type": "resume", "stream_id", "resume_token", "sample_offset", "events_received"}
                            (the samples the listener has, and the JSON messages of the stream
                            received after the last audio frame: not `stream` or `resumed`)
is answered {"type": "resumed", ...the same fields} and gets the audio from that sample on,
byte-exact, and every later message once. A refused resume is an error message with `code`
`not_found` (another replica, a restart, or the window passed: start a new stream),
`out_of_range` or `invalid_api_key`, then close 1008 or 1007. Every upgrade response names a
stream id in `chattts-stream-id`, the one a resumable stream begun on that socket gets: a proxy
sticks on it (and on a resume URL's `?stream_id=`).

server -> client
  binary frames             audio, in the configured encoding, in order.
  {"type": "utterance_end", "utterance_index", "text", "audio_duration_s",
   "time_to_first_audio_s", "generation_time_s", "num_tokens", "finish_reason",
   "sample_offset", "num_samples", "source_text", "source_start", "source_end", "lag_s",
   "speed"}
  {"type": "mark", "name", "sample_offset", "offset_s", "dropped"}   the answer to a mark.
  {"type": "segment_end", "name", "revision", "outcome", "sample_offset", "offset_s", "text"}
                            the one answer to a segment's revision; `outcome` is "spoken",
                            "replaced", "cut", "expired" or "not_spoken".
  {"type": "word_timings", "utterance_index", "source", "words": [{"text", "start_sample",
   "end_sample", "start_s", "end_s", "source_start", "source_end", "source_text",
   "has_source"}, ...]}     with `"word_timing": true` in the config: an utterance's words,
                            right before its utterance_end (api/events.py `to_json`).
  {"type": "done", "num_utterances", "audio_duration_s", "num_tokens"}   then close 1000.
  {"type": "stream" | "resumed", ...}   a resumable stream's id and token (see below).
  {"type": "error", "error": {"message", "type", "param", "code"}}       then close with
                            1008 (auth), 1007 (bad message or field), 1013 (full: retry
                            later), 1011 (synthesis failed).
  close 1008 with a reason, no error message: the client took no audio for --stall-timeout-s.
  close 1009: a message over --max-ws-message-bytes (uvicorn closes; the stream ends
                            INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequestError
from ...stream.reader import TextFragment
from ...stream.segments import IfStarted
from ...stream.settings import StreamSettings
from ..convert import Validator
from ..resume import ResumableStream, Resumer
from ..voices import VoiceLibrary
from .openai_fields import openai_settings, synthesis_config


def fragment(message: dict[str, Any]) -> TextFragment:
    kind = message.get("type")
    if kind == "config":
        raise InvalidRequestError("config", "config may be sent only once, as the first message")
    if kind == "resume":
        raise InvalidRequestError("type", "resume may be sent only as the first message")
    if kind in ("flush", "clear"):
        return TextFragment("", flush=kind == "flush", clear=kind == "clear")
    if kind == "mark":
        name = _string(message, "name")
        if not name:
            raise InvalidRequestError("name", "is required: the mark's name")
        return TextFragment("", mark=name)
    if kind == "replace":
        name = _string(message, "segment")
        if not name:
            raise InvalidRequestError("segment", "is required: the name of the segment to replace")
        return TextFragment(
            _string(message, "text"),
            replace=name,
            if_started=_if_started(message),
            expires_in_ms=_expires_ms(message),
        )
    if kind != "text":
        raise InvalidRequestError(
            "type",
            f"must be text, replace, flush, clear, mark, end or cancel, got {str(kind)[:20]!r}",
        )
    flags = {}
    for name in ("flush", "clear"):
        value = message.get(name, False)
        if not isinstance(value, bool):
            raise InvalidRequestError(name, "must be true or false")
        flags[name] = value
    return TextFragment(
        _string(message, "text"),
        flags["flush"],
        flags["clear"],
        _string(message, "mark"),
        segment=_string(message, "segment"),
        expires_in_ms=_expires_ms(message),
    )


def _if_started(message: dict[str, Any]) -> IfStarted:
    value = message.get("if_started", "finish")
    names = [h.value for h in IfStarted]
    if not isinstance(value, str) or value.lower() not in names:
        raise InvalidRequestError("if_started", f"must be one of {', '.join(names)}")
    return IfStarted(value.lower())


def _expires_ms(message: dict[str, Any]) -> int:
    value = message.get("expires_in_ms", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError("expires_in_ms", "must be a whole number of milliseconds, >= 0")
    return value


def count(message: dict[str, Any], name: str) -> int:
    value = message.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidRequestError(name, "must be a whole number, >= 0")
    return value


def _string(message: dict[str, Any], name: str) -> str:
    value = message.get(name, "")
    if not isinstance(value, str):
        raise InvalidRequestError(name, "must be a string")
    return value


def ws_settings(
    message: dict[str, Any], validator: Validator, voices: VoiceLibrary
) -> StreamSettings:
    """The config message as StreamSettings: SynthesisConfig's JSON with a named voice and a
    `response_format` name allowed, through the OpenAI mapping the POST route uses."""
    if message.get("type") != "config":
        raise InvalidRequestError("config", 'the first message must be {"type": "config", ...}')
    fields = {k: v for k, v in message.items() if k != "type"}
    voice = fields.get("voice")
    named_voice = isinstance(voice, str) or (isinstance(voice, dict) and set(voice) == {"id"})
    if named_voice:
        fields.pop("voice")
    response_format = (
        fields.pop("audio_format") if isinstance(fields.get("audio_format"), str) else None
    )
    return openai_settings(
        validator,
        voices,
        synthesis_config(fields, "config"),
        "config",
        voice=voice if named_voice else None,
        voice_param="config.voice",
        response_format=response_format,
        format_param="config.audio_format",
    )


@dataclass(frozen=True)
class ResumeRequest:
    """A socket's first message asked to resume a stream (`parse` checks its fields)."""

    stream_id: str
    token: str
    sample_offset: int
    events_received: int

    @classmethod
    def parse(cls, message: dict[str, Any]) -> ResumeRequest:
        return cls(
            _string(message, "stream_id"),
            _string(message, "resume_token"),
            count(message, "sample_offset"),
            count(message, "events_received"),
        )


@dataclass(frozen=True)
class Begin:
    """How a socket's stream begins: its settings (a new stream, resumable or not) or a resume;
    `stream_id` is the one its upgrade response named."""

    settings: StreamSettings | None
    resume: ResumeRequest | None = None
    resumable: bool = False
    stream_id: str = ""
    contexts: bool = False
    """A context socket (ws_contexts.py); `settings` are the socket's config."""
    first: dict[str, Any] | None = None
    """A context socket's first message, when it named a context."""


def stream_message(kind: str, resumer: Resumer, stream: ResumableStream, **fields: str) -> str:
    """A resumable stream's `stream` (begun) or `resumed` message: what a resume needs."""
    return json.dumps(
        {
            "type": kind,
            **fields,
            "stream_id": stream.stream_id,
            "resume_token": stream.token,
            "resume_window_s": resumer.window_s,
            "text_seq": stream.last_seq,
        }
    )


MAX_CONTEXT_ID_BYTES = 64


def context_id_of(message: dict[str, Any]) -> str:
    """The message's `context_id` (InvalidRequestError naming it when it is not one)."""
    value = message.get("context_id")
    if not isinstance(value, str) or not value or not value.isprintable():
        raise InvalidRequestError(
            "context_id", "must be a non-empty string of printable characters"
        )
    if len(value.encode()) > MAX_CONTEXT_ID_BYTES:
        raise InvalidRequestError("context_id", f"is over {MAX_CONTEXT_ID_BYTES} bytes in UTF-8")
    return value


def audio_frame(context_id: str, audio: bytes) -> bytes:
    """A context's audio frame: a header, then the audio as the stream would send it.

    Header: the header's length H (uint16, little-endian; a multiple of 4), the id's length in
    bytes (uint8), the id (UTF-8), zeros up to H. The audio starts at a 4-byte boundary, so a
    browser reads PCM in place: `new Int16Array(frame, H)` copies nothing."""
    raw = context_id.encode()
    size = 3 + len(raw)
    size += -size % 4
    return struct.pack("<HB", size, len(raw)) + raw + bytes(size - 3 - len(raw)) + audio

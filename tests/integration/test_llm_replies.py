"""Voice-agent replies through the real server: an LLM's output streamed token by token into
StreamingSynthesize with the generated stubs, as `some_llm | chattts-client say --stdin` does.

Every reply (English and Chinese, with paragraphs, lists, emphasis, code, links, emoji and the
whitespace-only tokens LLMs emit) must end OK, and what was spoken (`UtteranceEnd.text`) must hold
the reply's words and none of its markup, with no warning logged by ChatTTS's normalizer.
"""

from __future__ import annotations

import logging
import re

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from llm_replies import CHINESE, ENGLISH, MARKUP_SYMBOLS, MARKUP_WORDS, REPLIES, Reply, tokens

WAIT_S = 120.0
NUM_TOKENS = 4
"""Audio tokens per utterance: the text is under test here, not the audio."""


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def config(**fields: object) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=7),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=NUM_TOKENS, max_new_tokens=NUM_TOKENS),
        **fields,  # type: ignore[arg-type]
    )


def stream(stub, fragments: list[str], **fields: object) -> list[tts_pb2.UtteranceEnd]:
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=config(**fields))
        for fragment in fragments:
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=fragment))

    replies = stub.StreamingSynthesize(requests(), timeout=WAIT_S)
    return [r.utterance_end for r in replies if r.HasField("utterance_end")]


def words(text: str) -> str:
    return " ".join(re.findall(r"[\u4e00-\u9fff]|[^\W_]+", text.lower()))


def test_the_replies_cover_what_agents_send() -> None:
    assert len(ENGLISH) >= 6 and len(CHINESE) >= 4
    whole = "".join(r.text for r in REPLIES)
    for feature in ("\n\n", "**", "1. ", "- ", "```", "](http", "`", "| ", "🙂", "> "):
        assert feature in whole, feature
    assert any(t.strip() == "" for t in tokens(whole)), "no whitespace-only token"


@pytest.mark.parametrize("reply", REPLIES, ids=[r.name for r in REPLIES])
def test_a_reply_streamed_token_by_token_is_spoken_without_its_markup(
    stub, reply: Reply, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ends = stream(stub, tokens(reply.text))  # ends OK, or grpc.RpcError fails the test
    spoken = " ".join(e.text for e in ends)
    assert ends and all(e.finish_reason for e in ends)
    said = words(spoken)
    for expected in reply.says:
        assert words(expected) in said, (expected, spoken)
    for unwanted in reply.never:
        assert unwanted not in said, (unwanted, spoken)
    for markup in MARKUP_WORDS:
        if not any(markup in s for s in reply.says):
            assert markup not in said, (markup, spoken)
    assert not set(spoken) & set(MARKUP_SYMBOLS), spoken
    assert not re.search(r"\d", spoken), spoken
    noise = [r.getMessage() for r in caplog.records if "invalid characters" in r.getMessage()]
    assert noise == []


def test_a_stream_of_only_whitespace_ends_ok_with_no_utterance(stub) -> None:
    assert stream(stub, [" ", "\n", "\n\n", "\t", "", " "]) == []


def test_whitespace_tokens_separate_words_and_newlines_end_sentences(stub) -> None:
    ends = stream(stub, ["Turn", " ", "left", "\n", "Then", "\t", "exit", "\n\n"])
    assert [e.text for e in ends] == ["Turn left", "Then exit"]


def test_synthesize_still_rejects_whitespace_only_text(stub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text=" \n\t", config=config())))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text" in err.value.details()


def test_synthesize_reads_markdown_like_the_stream(stub) -> None:
    reply = ENGLISH[0]
    replies = stub.Synthesize(
        tts_pb2.SynthesizeRequest(text=reply.text, config=config()), timeout=WAIT_S
    )
    spoken = " ".join(r.utterance_end.text for r in replies if r.HasField("utterance_end"))
    # No release for quiet: on a loaded machine a token can wait past idle_ms (600 ms), and
    # "Here" would be released before its "'s" came.
    release = tts_pb2.TextReleasePolicy(idle_ms=60000)
    streamed = " ".join(e.text for e in stream(stub, tokens(reply.text), text_release=release))
    assert words(spoken) == words(streamed)
    assert "*" not in spoken


def test_synthesize_of_only_a_code_block_says_there_is_nothing_to_read(stub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="```\nls -la\n```", config=config())))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "markdown" in err.value.details()


def test_plain_text_format_reads_literal_markup_characters(stub) -> None:
    plain = stream(stub, ["2 * 3 is *six*\n"], text_format=tts_pb2.PLAIN)
    markdown = stream(stub, ["2 * 3 is *six*\n"], text_format=tts_pb2.MARKDOWN)
    assert words(markdown[0].text) == "two times three is six"
    assert words(plain[0].text) == "two times three is asterisk six asterisk"
    assert stream(stub, ["# Title\n"])[0].text == "Title."  # the default is markdown


def test_an_unknown_text_format_is_invalid_argument_naming_the_field(stub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stream(stub, ["Hello."], text_format=7)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.text_format" in err.value.details()

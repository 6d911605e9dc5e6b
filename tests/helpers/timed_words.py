"""Word timings and utterance ends as a server would send them, built from the caller's text:
for the client's timeline and subtitle tests, which need no server."""

from __future__ import annotations

from chattts_client import UtteranceEndEvent, WordTiming, WordTimingsEvent

RATE_HZ = 24000


def utterance(
    text: str,
    words: list[tuple[str, str]],
    *,
    index: int,
    start_sample: int,
    word_samples: int = 7200,
    pause_samples: int = 0,
    search_from: int = 0,
    finish_reason: str = "eos",
    spoken_until: int | None = None,
) -> tuple[WordTimingsEvent, UtteranceEndEvent]:
    """One utterance of `text` (the whole text sent on the stream): each `(spoken, source)` is
    a word as spoken and the first stretch of `text` from `search_from` on that it came from
    (the same stretch may give several words). Words last `word_samples`, with `pause_samples`
    between them; `spoken_until` cuts the utterance (a clear) at that stream sample."""
    timings: list[WordTiming] = []
    cursor, sample = search_from, start_sample
    first_source = None
    last_span: tuple[int, int] | None = None
    for spoken, source in words:
        if last_span is not None and text[last_span[0] : last_span[1]] == source:
            begin, end = last_span  # another word of the same stretch ("200 m")
        else:
            begin = text.index(source, cursor)
            end = begin + len(source)
        cursor = end
        last_span = (begin, end)
        first_source = begin if first_source is None else first_source
        stop = sample + word_samples
        if spoken_until is not None and stop > spoken_until:
            continue  # cut off: its text is the utterance's, its timing is not sent
        timings.append(
            WordTiming(
                text=spoken,
                start_sample=sample,
                end_sample=stop,
                start_s=sample / RATE_HZ,
                end_s=stop / RATE_HZ,
                source_start=begin,
                source_end=end,
                source_text=source,
                has_source=True,
            )
        )
        sample = stop + pause_samples
    assert first_source is not None
    source_end = cursor
    while source_end < len(text) and text[source_end] in ".,!?;:。，！？":
        source_end += 1  # the utterance's punctuation is its text, spoken as a pause
    audio_end = sample if spoken_until is None else spoken_until
    end = UtteranceEndEvent(
        utterance_index=index,
        text=" ".join(s for s, _ in words),
        audio_duration_s=(audio_end - start_sample) / RATE_HZ,
        time_to_first_audio_s=0.1,
        generation_time_s=0.2,
        num_tokens=10,
        finish_reason=finish_reason,
        sample_offset=start_sample,
        num_samples=audio_end - start_sample,
        source_text=text[first_source:source_end],
        source_start=first_source,
        source_end=source_end,
    )
    return WordTimingsEvent(index, tuple(timings), "TIMING_ESTIMATE"), end

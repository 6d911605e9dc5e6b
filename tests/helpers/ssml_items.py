"""SSML documents read into utterance items, as the SSML unit tests (test_ssml.py,
test_ssml_stream.py) compare them."""

from __future__ import annotations

from chattts_server.text.ssml import Item, SpeechItem, ssml_items


def items(doc: str, speed: int = 5, **kw: bool) -> list[Item]:
    return ssml_items(doc, 30.0, speed, **kw)


def readout(found: list[Item]) -> list[object]:
    """Items as comparable values: (text, speed), Break, MarkPart."""
    return [(i.text.text, i.speed) if isinstance(i, SpeechItem) else i for i in found]

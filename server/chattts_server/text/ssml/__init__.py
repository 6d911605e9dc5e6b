"""SSML in: a safe parser of the subset navigation and IVR callers write, and its streaming.

`ssml_items` reads a whole document, `SsmlStream` one sent in fragments; both give `Item`s:
utterances (`SpeechItem`: text traced to the document, speed), silences (`Break`) and marks
(`MarkPart`). The element table is in `elements.py` (and docs/api.md); parsing safety (no DTD,
entities or external references; depth and element limits) in `document.py`.
"""

from .elements import ELEMENTS, parse_ssml
from .parts import Break, Item, MarkPart, Part, SpeechItem, SpokenText
from .stream import SsmlStream, ssml_items

# fmt: off
__all__ = [
    "ELEMENTS", "Break", "Item", "MarkPart", "Part", "SpeechItem", "SpokenText", "SsmlStream",
    "parse_ssml", "ssml_items",
]
# fmt: on

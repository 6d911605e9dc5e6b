"""Links, e-mail addresses, file names, @handles and #hashtags, read as people say them.

    readable("Docs at https://example.com/docs.", "en")  # 'Docs at example dot com slash docs.'
    readable("写信到 name@example.com", "zh")              # '写信到 name 艾特 example 点 com'

Read letter by letter by the number and symbol grammars, a URL comes out as "HTTPS colon slash
slash example dot com slash docs"; people drop the scheme, the `www.` and the query string and
say the rest. Runs before the number rules, so digits in a link are spelled like any other.
Traced (`readable_traced`), a link's words all come from the whole link: it is one word of the
caller's text, as a number is.
"""

from __future__ import annotations

import re

from .script import Language
from .spans import Traced

_WORDS = {
    "en": {".": " dot ", "/": " slash ", "@": " at ", "_": " underscore ", "-": " dash "},
    "zh": {".": " 点 ", "/": " 斜杠 ", "@": " 艾特 ", "_": " 下划线 ", "-": " 杠 "},
}
_HASHTAG = {"en": "hashtag ", "zh": "话题 "}
_TLDS = (
    "com|org|net|io|dev|ai|app|co|edu|gov|info|me|tv|us|uk|de|fr|cn|jp|ru|in|eu|ca|au|nl|"
    "ch|it|es|se|no|ly|sh|xyz|site|cloud|tech"
)
# Trailing punctuation is the sentence's, not the link's.
_TAIL = r"(?<![.,;:!?'\")\]])"
_URL = re.compile(rf"\b(?:https?://|ftp://|www\.)[^\s<>\"'，。、（）]+{_TAIL}", re.I)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\b")
_DOMAIN = re.compile(
    rf"(?<![\w@.-])(?:[A-Za-z0-9-]+\.)+(?:{_TLDS})\b(?:/[^\s<>\"'，。、（）]*{_TAIL})?", re.I
)
_FILE_EXT = (
    "py|js|ts|tsx|jsx|json|yaml|yml|toml|ini|cfg|conf|md|txt|csv|tsv|log|pdf|png|jpe?g|gif|"
    "svg|webp|html?|css|sh|bash|zip|tar|gz|tgz|docx?|xlsx?|pptx?|exe|dmg|mp3|mp4|wav|ogg|"
    "flac|mov|go|rs|java|cpp|hpp|c|h|rb|php|sql|ipynb|proto|lock"
)
_FILE = re.compile(
    rf"(?<![\w@/.-])(?:~?/)?(?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:{_FILE_EXT})\b(?![\w/-])", re.I
)
_HANDLE = re.compile(r"(?<![\w@.])@(?=[A-Za-z_])(\w{1,39})")
_HASH = re.compile(r"(?<![\w#&])#(?=[A-Za-z\u4e00-\u9fff])(\w{1,60})")


def link_spans(text: str) -> list[tuple[int, int]]:
    """Where `text` holds a link, an e-mail address, a domain or a file name: [start, end) each,
    in order, overlapping ones merged. Stages before the normalizer leave these alone (a
    pronunciation lexicon, text/lexicon.py): `readable` spells each as a whole."""
    if not any(c in text for c in ".@/"):
        return []
    found = sorted(m.span() for p in (_URL, _EMAIL, _DOMAIN, _FILE) for m in p.finditer(text))
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _spoken(text: str, lang: Language) -> str:
    words = _WORDS[lang]
    out = "".join(words.get(c, c) for c in text)
    return re.sub(r"\s+", " ", out).strip()


def _url(m: re.Match[str], lang: Language) -> str:
    link = re.sub(r"^(?:[a-z]+://)?(?:www\.)?", "", m.group(), flags=re.I)
    link = re.split(r"[?#]", link, maxsplit=1)[0].rstrip("/")
    return " " + _spoken(link, lang) + " "


def readable(text: str, lang: Language) -> str:
    """text with its links, addresses, file names, handles and hashtags spelled as spoken."""
    return readable_traced(Traced.source(text), lang).text


def readable_traced(text: Traced, lang: Language) -> Traced:
    """`readable`, each spelled link traced to the link."""
    if not any(c in text.text for c in ".@#/"):
        return text
    text = text.sub(_URL, lambda m: _url(m, lang))
    text = text.sub(_EMAIL, lambda m: " " + _spoken(m.group(), lang) + " ")
    text = text.sub(_DOMAIN, lambda m: _url(m, lang))
    text = text.sub(_FILE, lambda m: " " + _spoken(m.group(), lang) + " ")
    text = text.sub(_HANDLE, lambda m: " " + _spoken("@" + m.group(1), lang) + " ")
    return text.sub(_HASH, lambda m: " " + _HASHTAG[lang] + _spoken(m.group(1), lang) + " ")

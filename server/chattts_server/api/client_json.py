"""Client JSON (the POST body, each WebSocket frame) parsed within bounds, or refused naming
the field.

The caller has bounded the size already (`--max-body-bytes`, `--max-ws-message-bytes`). Here:
the text must be UTF-8 JSON; nesting deeper than MAX_JSON_DEPTH is refused (a 10,000-level
`[[[...]]]` would otherwise end in a RecursionError, in `json` or in protobuf's parser); every
string and object key must be valid Unicode (a `"\\ud800"` escape decodes to a lone surrogate,
which protobuf's parser meets with a SystemError and no encoder can write). Every failure is an
InvalidRequestError naming where it is (`chattts.sampling`), never another exception.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequestError

MAX_JSON_DEPTH = 32
"""Levels of arrays and objects; a SynthesisConfig in JSON nests four."""


def parse_json(data: bytes | str, field_name: str, prefix: str = "") -> Any:
    """`load_json`, then `check_json`: the value, or InvalidRequestError naming the field."""
    value = load_json(data, field_name)
    check_json(value, field_name, prefix)
    return value


def load_json(data: bytes | str, field_name: str) -> Any:
    """The JSON value of `data`; InvalidRequestError naming `field_name` when it is not UTF-8
    JSON or nests past what the parser can take. Check the value with `check_json`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text)
    except UnicodeDecodeError:
        raise InvalidRequestError(field_name, "is not UTF-8") from None
    except RecursionError:
        raise _too_deep(field_name) from None
    except ValueError as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise InvalidRequestError(field_name, f"is not valid JSON: {str(exc)[:100]}") from None


def check_json(value: Any, field_name: str, prefix: str = "") -> None:
    """InvalidRequestError if `value` nests deeper than MAX_JSON_DEPTH or holds a lone
    surrogate; it names the member (`prefix` + its path: `config.sampling`), or `field_name`
    for the value itself."""
    _check(value, [], 0, field_name, prefix)


def _too_deep(path: str) -> InvalidRequestError:
    return InvalidRequestError(path, f"nests deeper than {MAX_JSON_DEPTH} levels")


def _check(value: Any, keys: list[str], depth: int, field_name: str, prefix: str) -> None:
    # The depth bound keeps this recursion short.
    if isinstance(value, str):
        _check_text(value, keys, field_name, prefix)
    elif isinstance(value, (dict, list)):
        if depth >= MAX_JSON_DEPTH:
            raise _too_deep(_path(keys, field_name, prefix))
        if isinstance(value, list):
            for item in value:
                _check(item, keys, depth + 1, field_name, prefix)
            return
        for key, item in value.items():
            _check_text(key, keys, field_name, prefix)
            _check(item, [*keys, key], depth + 1, field_name, prefix)


def _path(keys: list[str], field_name: str, prefix: str) -> str:
    return prefix + ".".join(keys) if keys else field_name


def _check_text(text: str, keys: list[str], field_name: str, prefix: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(
            _path(keys, field_name, prefix),
            "holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not valid text",
        ) from None

"""How a config field is declared (`option`) and checked: its flag name, its bounds and choices.

`config` declares the fields with `option(...)`; `config_cli` builds the command line from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from .defaults import ConfigError


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[Any, ...] | None = None,
    bounds: tuple[float | None, float | None] | None = None,
    unset: str | None = None,
    switch: str | None = None,
    group: str | None = None,
) -> Any:
    """A config field and its command-line flag.

    `bounds`: inclusive (low, high), either may be None. `unset`: what a None default means,
    shown as the default in --help. `switch`: 'on-off' for a bool flag taking on/off, 'both'
    for `--name` and `--no-name` (default: a bool is a `--name` flag when False by default,
    `--no-name` when True). `group`: the --help
    group of a top-level field."""
    meta = {"help": help, "choices": choices, "bounds": bounds, "unset": unset, "switch": switch}
    return field(default=default, metadata={**meta, "group": group})


def flag_name(f: dataclasses.Field[Any]) -> str:
    name = f.name.replace("_", "-")
    if f.default is True and f.metadata["switch"] is None:
        return f"--no-{name}"
    return f"--{name}"


def check_value(f: dataclasses.Field[Any], value: Any) -> None:
    choices, bounds = f.metadata["choices"], f.metadata["bounds"]
    if value is None:
        return
    if choices is not None:
        check(
            value in choices, f"{flag_name(f)} must be one of {', '.join(choices)}, got {value!r}"
        )
    if bounds is not None:
        low, high = bounds
        if high is None:
            check(value >= low, f"{flag_name(f)} must be >= {low:g}")
        else:
            low_text = "-inf" if low is None else f"{low:g}"
            ok = (low is None or value >= low) and value <= high
            check(ok, f"{flag_name(f)} must be in [{low_text}, {high:g}]")

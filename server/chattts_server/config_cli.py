"""The command line and `ServerConfig`: `build_parser` makes one flag per config field
(`--max-streams` for `EngineConfig.max_streams`), with the help, choices and bounds its
`option(...)` declares, and `config_from_args` maps the parsed flags back to a validated tree."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any

from .config import SECTIONS, ServerConfig
from .config_fields import flag_name


def _add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field[Any], kind: type) -> None:
    m = f.metadata
    help_text = m["help"]
    if kind is tuple:  # repeatable: one value per flag
        group.add_argument(
            flag_name(f), action="append", metavar="FILE", help=f"{help_text} (default: none)"
        )
        return
    if kind is bool and m["switch"] is None:
        group.add_argument(flag_name(f), action="store_true", help=help_text)
        return
    if kind is bool and m["switch"] == "both":
        group.add_argument(
            flag_name(f),
            action=argparse.BooleanOptionalAction,
            default=f.default,
            help=f"{help_text} (default: %(default)s)",
        )
        return
    if kind is bool:  # on-off
        default: Any = "on" if f.default else "off"
        group.add_argument(
            flag_name(f),
            choices=["on", "off"],
            default=default,
            help=f"{help_text} (default: %(default)s)",
        )
        return
    shown = f"(default: {m['unset']})" if f.default is None else "(default: %(default)s)"
    group.add_argument(
        flag_name(f),
        type=str if kind is Path else kind,
        choices=list(m["choices"]) if m["choices"] else None,
        default=None if f.default is None else str(f.default) if kind is Path else f.default,
        help=f"{help_text} {shown}",
    )


def _kind(annotation: Any) -> type:
    """The scalar type of a field annotation (`int | None` -> int); `tuple` for a repeatable
    flag's (`tuple[Path, ...]`)."""
    if typing.get_origin(annotation) is tuple:
        return tuple
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation  # type: ignore[no-any-return]


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], type]]:
    hints = typing.get_type_hints(cls)
    return [(f, _kind(hints[f.name])) for f in dataclasses.fields(cls) if "help" in f.metadata]


def build_parser() -> argparse.ArgumentParser:
    """The command line, one flag per `option` field of the config tree."""
    p = argparse.ArgumentParser(
        prog="chattts-server",
        description="Streaming ChatTTS speech synthesis over gRPC (chattts.v1.TextToSpeech).",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    section_types = typing.get_type_hints(ServerConfig)
    top = _fields(ServerConfig)
    for name, title in SECTIONS:
        group = groups.get(title) or groups.setdefault(title, p.add_argument_group(title))
        for f, kind in _fields(section_types[name]):
            _add_flag(group, f, kind)
        for f, kind in top:
            if f.metadata["group"] == name:
                _add_flag(group, f, kind)
    for f, kind in top:
        if f.metadata["group"] is None:
            _add_flag(p, f, kind)  # type: ignore[arg-type]
    return p


def _value(args: argparse.Namespace, f: dataclasses.Field[Any], kind: type) -> Any:
    value = getattr(args, f.name if not flag_name(f).startswith("--no-") else f"no_{f.name}")
    if kind is bool:
        if f.metadata["switch"] == "on-off":
            return value == "on"
        if f.metadata["switch"] == "both":
            return value
        return not value if flag_name(f).startswith("--no-") else value
    if kind is Path:
        return Path(value) if value else None
    if kind is tuple:
        return tuple(Path(v) for v in value or ())
    return value


def config_from_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse the command line into a validated `ServerConfig` (raises ConfigError)."""
    args = build_parser().parse_args(argv)
    section_types = typing.get_type_hints(ServerConfig)
    sections = {
        name: section_types[name](
            **{f.name: _value(args, f, k) for f, k in _fields(section_types[name])}
        )
        for name, _ in SECTIONS
    }
    top = {f.name: _value(args, f, k) for f, k in _fields(ServerConfig)}
    return ServerConfig(**sections, **top).validate()

"""`chattts-server --help` explains every flag and shows its default."""

from __future__ import annotations

import argparse

import pytest

from chattts_server.config_cli import build_parser

PARSER = build_parser()
FLAGS = [a for a in PARSER._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("action", FLAGS, ids=lambda a: a.option_strings[0])
def test_every_flag_has_a_help_line(action: argparse.Action) -> None:
    assert action.help and action.help.strip() and "\n" not in action.help


@pytest.mark.parametrize(
    "action",
    [a for a in FLAGS if a.default not in (None, False)],
    ids=lambda a: a.option_strings[0],
)
def test_every_flag_with_a_default_shows_it(action: argparse.Action) -> None:
    assert action.help is not None and "%(default)s" in action.help


def test_help_lists_every_flag_with_its_default() -> None:
    text = " ".join(PARSER.format_help().split())  # undo argparse's line wrapping
    for action in FLAGS:
        assert action.option_strings[0] in text
    assert "--max-streams MAX_STREAMS streams generating at once" in text
    assert "(default: 16)" in text

"""The client's lexicons (chattts_client/config.py): `SynthesisOptions.lexicons` into the
config in order, and `lexicon_value`, what `chattts-client say --lexicon` sends: a file's PLS
text inline, a name as is, a missing file refused here rather than sent as a name."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_client.config import SynthesisOptions, lexicon_value

PLS = '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"/>'


def test_options_carry_lexicons_into_the_config_in_order() -> None:
    options = SynthesisOptions(voice="seed:3", lexicons=("nav", PLS))
    config = options.to_config()
    assert list(config.lexicons) == ["nav", PLS] and config.voice.seed == 3
    assert list(options.to_config(lexicons=()).lexicons) == []


def test_a_file_is_sent_inline_and_anything_else_as_a_name(tmp_path: Path) -> None:
    mine = tmp_path / "mine.pls"
    mine.write_text(PLS, encoding="utf-8")
    assert lexicon_value(str(mine)) == PLS
    assert lexicon_value("nav") == "nav"
    for missing in (str(tmp_path / "gone"), "gone.pls", "roads.xml"):
        with pytest.raises(FileNotFoundError, match="no lexicon file"):
            lexicon_value(missing)

"""The subprocess launcher shared by tests and benchmarks reports a failed start with its output."""

from __future__ import annotations

import pytest

from chattts_devtools.launcher import launch


def test_a_server_that_exits_at_start_is_reported_with_its_output(tmp_path) -> None:
    with pytest.raises(RuntimeError) as info:
        launch(["--max-streams", "0"], cache=tmp_path, start_timeout_s=60)
    message = str(info.value)
    assert "server did not start (exit 2)" in message
    assert "--max-streams must be in [1, 1024]" in message

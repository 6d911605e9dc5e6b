"""The committed stubs are exactly what protos/ generates (`make proto` regenerates them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "client" / "chattts_proto"


def test_stubs_match_the_proto(tmp_path):
    out = tmp_path / "chattts_proto"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_proto.py"), str(out)],
        check=True,
        capture_output=True,
    )
    generated = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    committed = {
        p.relative_to(COMMITTED): p.read_bytes()
        for p in COMMITTED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert generated.keys() == committed.keys()
    stale = [str(k) for k in generated if generated[k] != committed[k]]
    assert not stale, f"stubs differ from protos/: {stale}; run `make proto`"


def test_client_package_needs_no_torch_or_server_code():
    """A user who only calls the service installs no torch: the client must not import it."""
    code = (
        "import sys, chattts_client, chattts_client.cli, chattts_client.wav\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'chattts_server', 'ChatTTS'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO / "client")

"""Generate the Python gRPC stubs from protos/ into a package of chattts_client.

protoc writes imports relative to the proto root (`from chattts.v1 import tts_pb2`); we
rewrite them to absolute imports under `chattts_client._proto` so the stubs live inside our
package and need no top-level `chattts` module on sys.path.

Usage: python tools/gen_proto.py [OUT_DIR]   (default: client/chattts_client/_proto)
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
PACKAGE = "chattts_client._proto"


def generate(out_dir: Path) -> list[Path]:
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(protoc.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p.relative_to(PROTO_ROOT)) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        written = []
        for src in sorted(Path(tmp).rglob("*.py*")):
            rel = src.relative_to(tmp)
            dst = out_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            text = re.sub(r"^from chattts\.", f"from {PACKAGE}.chattts.", text, flags=re.M)
            dst.write_text(text)
            written.append(dst)
    for folder in {p.parent for p in written} | {out_dir}:
        walk = folder
        while walk != out_dir.parent:
            (walk / "__init__.py").touch()
            walk = walk.parent
    return written


def main() -> None:
    out_dir = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "client" / "chattts_client" / "_proto"
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for path in generate(out_dir):
        print(path.relative_to(out_dir.parent) if out_dir.parent in path.parents else path)


if __name__ == "__main__":
    main()

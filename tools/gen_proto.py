"""Generate the Python gRPC stubs from protos/ into a package of chattts_client.

protoc writes imports relative to the proto root (`from chattts.v1 import tts_pb2`); we
rewrite them to absolute imports under `chattts_client._proto` so the stubs live inside our
package and need no top-level `chattts` module on sys.path.

Usage: python tools/gen_proto.py [OUT_DIR]   (default: client/chattts_client/_proto)
       python tools/gen_proto.py --check     (generate into a temp dir, compare, write nothing)
"""

from __future__ import annotations

import argparse
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


def stale_stubs(committed: Path) -> list[str]:
    """The stub files under `committed` that differ from what protos/ generates (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / committed.name
        generate(out)
        fresh = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    have = {
        p.relative_to(committed): p.read_bytes()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted(str(k) for k in fresh.keys() | have.keys() if fresh.get(k) != have.get(k))


def main() -> int:
    default_out = ROOT / "client" / "chattts_client" / "_proto"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=default_out,
        help="package folder to (re)write (default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        "--smoke",
        action="store_true",
        help="only compare OUT_DIR with freshly generated stubs; exit 1 if they differ",
    )
    args = parser.parse_args()
    if args.check:
        stale = stale_stubs(args.out_dir)
        if stale:
            print(
                f"stubs in {args.out_dir} differ from protos/: {', '.join(stale)}; run `make proto`"
            )
            return 1
        print(f"stubs in {args.out_dir} are up to date with protos/")
        return 0
    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    for path in generate(args.out_dir):
        parent = args.out_dir.parent
        print(path.relative_to(parent) if parent in path.parents else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

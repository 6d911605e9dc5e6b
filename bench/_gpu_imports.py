"""Import check for bench/gpu_check.sh, run right after the carried wheels are installed.

Imports every package of bench/gpu_wheels.txt and prints its version and where it was found
(with `--target DIR`, each must come from DIR: the carried copy, not the image's), checks the
version is the pinned one, then imports what the image must provide (torch, torchaudio, numpy,
...), the project's server, client and serving benchmark, and checks that the server, without
PyAV, turns OGG_OPUS off. Prints one line per package and exits 1 if anything is missing or
wrong, so the long steps never start on a broken install.

For the dry run on a CPU:
- `--outside-image`: a Python without the image's packages (the dry run's Python 3.12 has no
  torch or numpy): an import that fails only because such a package is absent is reported as
  deferred, not as a failure; anything else still fails.
- `--link-image-view DIR` (the venv's Python): links into DIR those of the venv's
  distributions that the GPU machine will have, the image's (bench/gpu_image.txt; nvidia-*-cu12
  count as nvidia-*) and the carried ones, and exits.
- `--image-view DIR` (the venv's Python with -S, so no site-packages of its own): DIR is the
  only site-packages, so a package in neither list fails to import as it would on the GPU
  machine. Implies `--target DIR`.
- `--collect FILE...`: then collect those test files (pytest --collect-only) in this process.

Usage: python bench/_gpu_imports.py [--target DIR] [--outside-image] [--collect FILE ...]
       python bench/_gpu_imports.py --link-image-view DIR
       python -S bench/_gpu_imports.py --image-view DIR [--collect FILE ...]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import importlib.util
import re
import site
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
FROM_IMAGE = ["torch", "torchaudio", "numpy", "numba", "scipy", "safetensors", "requests"]
FROM_IMAGE += ["prometheus-client", "tqdm", "pytest", "pytest-timeout", "matplotlib"]
"""What the image must provide (bench/gpu_image.txt lists all it has), each imported as its
name with _ for -."""
PROJECT = ["chattts_client", "chattts_server.main", "chattts_server.engine.runner"]
PROJECT += ["chattts_server.devmodel.assets", "bench_serving"]
"""The project itself (from the tree, not a wheel): what the server, the bench and the tests
load."""


def _norm(name: str) -> str:
    return re.sub(r"-cu1\d$", "", re.sub(r"[-_.]+", "-", name).lower())


def _listed(name: str) -> list[list[str]]:
    """Each line's fields in bench/<name>, comments dropped."""
    lines = (BENCH / name).read_text().splitlines()
    return [fields for line in lines if (fields := line.split("#", 1)[0].split())]


def carried() -> list[tuple[str, str, list[str]]]:
    """(name, pinned version, modules) of each carried package."""
    rows = []
    for fields in _listed("gpu_wheels.txt"):
        name, version = fields[0].split("==")
        rows.append((name, version, fields[1].split(",")))
    return rows


def link_image_view(view: Path) -> None:
    names = {_norm(fields[0]) for fields in _listed("gpu_image.txt")}
    names |= {_norm(name) for name, _, _ in carried()}
    view.mkdir(parents=True, exist_ok=True)
    linked = 0
    for dist in md.distributions():
        if _norm(dist.metadata["Name"]) not in names:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__", "bin"}):
            source, link = Path(str(dist.locate_file(top))), view / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
        linked += 1
    print(f"image view in {view}: {linked} of this venv's packages (the image's, the carried)")


class Check:
    """The failures and deferred imports found so far."""

    def __init__(self, outside_image: bool) -> None:
        self.outside = {_norm(fields[0]) for fields in _listed("gpu_image.txt")} | {"pil"}
        self.outside_image = outside_image
        self.failures: list[str] = []
        self.deferred: list[str] = []

    def fail(self, what: str) -> None:
        self.failures.append(what)
        print(f"  FAILED   {what}"[:400])

    def imports(self, label: str, modules: list[str]) -> bool:
        for module in modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                missing = (exc.name or "").split(".")[0]
                if self.outside_image and missing and _norm(missing) in self.outside:
                    self.deferred.append(label)
                    print(f"  deferred {label}: {module} needs {missing}, absent outside the image")
                else:
                    self.fail(f"{label}: import {module}: {exc}")
                return False
            except Exception as exc:  # noqa: BLE001 - any import error is a failure to report
                self.fail(f"{label}: import {module}: {exc!r}")
                return False
        return True


def check_carried(check: Check, target: Path | None) -> None:
    print("carried (bench/gpu_wheels.txt):")
    for name, version, modules in carried():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            check.fail(f"{name}=={version}: not installed")
            continue
        where = Path(str(dist.locate_file(""))).resolve()
        if dist.version != version:
            check.fail(f"{name}: {dist.version} installed, {version} pinned")
        if target is not None and where != target:
            check.fail(f"{name}: found in {where}, not in {target}")
        if check.imports(f"{name}=={dist.version}", modules):
            print(f"  ok       {name}=={dist.version}  {','.join(modules)}  ({where})")


def check_the_rest(check: Check) -> None:
    print("from the image:")
    for name in FROM_IMAGE:
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            version = "?"
        if check.imports(f"{name}=={version}", [name.replace("-", "_")]):
            print(f"  ok       {name}=={version}")
    print("the project (this tree):")
    for module in PROJECT:
        if check.imports(module, [module]):
            print(f"  ok       {module}")
    encoding = "chattts_server.audio.encoding"
    if importlib.util.find_spec("av") is None and check.imports(encoding, [encoding]):
        from chattts_server.audio.encoding import available_encodings

        if "OGG_OPUS" in available_encodings():
            check.fail("without PyAV the server still offers OGG_OPUS")
        else:
            print("PyAV (av) not installed: the server refuses OGG_OPUS, as intended here")
    if "torch" in sys.modules:
        import torch

        cuda = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if cuda else "-"
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {cuda} ({name})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, help="the folder the wheels were installed into")
    parser.add_argument("--outside-image", action="store_true", help="defer the image's imports")
    parser.add_argument("--link-image-view", type=Path, metavar="DIR", help="make it and exit")
    parser.add_argument("--image-view", type=Path, metavar="DIR", help="the only site-packages")
    parser.add_argument("--collect", nargs="+", default=[], metavar="FILE", help="test files")
    args = parser.parse_args()
    if args.link_image_view:
        link_image_view(args.link_image_view)
        return 0
    if args.image_view:
        site.addsitedir(str(args.image_view))
        args.target = args.image_view
    started = time.monotonic()
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    check = Check(args.outside_image)
    check_carried(check, args.target.resolve() if args.target else None)
    check_the_rest(check)
    if args.collect and not check.failures:
        import pytest

        if pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", *args.collect]):
            check.fail(f"collecting {' '.join(args.collect)}")
    seconds = time.monotonic() - started
    if check.failures:
        print(f"IMPORT CHECK FAILED ({len(check.failures)}) in {seconds:.1f} s:")
        print("\n".join(f"  {failure}" for failure in check.failures))
        return 1
    print(f"import check ok in {seconds:.1f} s ({len(check.deferred)} deferred: needs the image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

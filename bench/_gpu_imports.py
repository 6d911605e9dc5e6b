"""Import check for bench/gpu_check.sh, run right after the carried wheels are installed.

Imports every package of bench/gpu_wheels.txt and prints its version and where it was found
(with `--target DIR`, each must come from DIR: the carried copy, not the image's), checks the
version is the pinned one, then imports what the image must provide (torch, torchaudio, numpy,
...) and the project's own server and client packages. Prints one line per package and exits 1
if anything is missing or wrong, so the long steps never start on a broken install.

`--outside-image` is for a Python without the image's packages (the dry run's Python 3.12 has
no torch or numpy): an import that fails only because such a package is absent is reported as
deferred, not as a failure; anything else still fails.

Usage: python bench/_gpu_imports.py [--target DIR] [--outside-image]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import re
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# What the image must provide (bench/gpu_image.txt lists all it has): distribution, module.
FROM_IMAGE = [
    ("torch", "torch"),
    ("torchaudio", "torchaudio"),
    ("numpy", "numpy"),
    ("numba", "numba"),
    ("scipy", "scipy"),
    ("safetensors", "safetensors"),
    ("requests", "requests"),
    ("prometheus-client", "prometheus_client"),
    ("tqdm", "tqdm"),
    ("pytest", "pytest"),
    ("pytest-timeout", "pytest_timeout"),
    ("matplotlib", "matplotlib"),
]
# The project itself (from the tree, not a wheel): what the server, the bench and the tests load.
PROJECT = ["chattts_client", "chattts_server.main", "chattts_server.engine.runner"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried(path: Path) -> list[tuple[str, str, list[str]]]:
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            name, version = fields[0].split("==")
            rows.append((name, version, fields[1].split(",")))
    return rows


def image_names() -> set[str]:
    lines = (BENCH / "gpu_image.txt").read_text().splitlines()
    return {_norm(x) for x in lines if x.strip() and not x.startswith("#")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the folder the wheels were installed into")
    parser.add_argument(
        "--outside-image",
        action="store_true",
        help="the image's packages are absent here: defer imports that need only them",
    )
    args = parser.parse_args()
    target = Path(args.target).resolve() if args.target else None
    image = image_names()
    started = time.monotonic()
    failures: list[str] = []
    deferred: list[str] = []
    print(f"python {sys.version.split()[0]} at {sys.executable}")

    def try_import(label: str, modules: list[str]) -> bool:
        for module in modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                missing = (exc.name or "").split(".")[0]
                if args.outside_image and missing and _norm(missing) in image | {"pil"}:
                    deferred.append(f"{label} (needs the image's {missing})")
                    print(f"  deferred {label}: {module} needs {missing}, absent outside the image")
                    return False
                failures.append(f"{label}: import {module}: {exc}")
                print(f"  FAILED   {label}: import {module}: {exc!r}")
                return False
            except Exception as exc:  # noqa: BLE001 - any import error is a failure to report
                failures.append(f"{label}: import {module}: {exc!r}")
                print(f"  FAILED   {label}: import {module}: {exc!r}"[:400])
                return False
        return True

    print("carried (bench/gpu_wheels.txt):")
    for name, version, modules in carried(BENCH / "gpu_wheels.txt"):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            failures.append(f"{name}=={version}: not installed")
            print(f"  FAILED   {name}=={version}: not installed")
            continue
        where = Path(str(dist.locate_file(""))).resolve()
        if dist.version != version:
            failures.append(f"{name}: {dist.version} installed, {version} pinned")
        if target is not None and where != target:
            failures.append(f"{name}: found in {where}, not in {target}")
        if try_import(f"{name}=={dist.version}", modules):
            print(f"  ok       {name}=={dist.version}  {','.join(modules)}  ({where})")
    print("from the image:")
    for name, module in FROM_IMAGE:
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            version = "?"
        if try_import(f"{name}=={version}", [module]):
            print(f"  ok       {name}=={version}")
    print("the project (this tree):")
    for module in PROJECT:
        if try_import(module, [module]):
            print(f"  ok       {module}")
    try:
        import av  # noqa: F401 - only to say whether OGG_OPUS will be served
    except ImportError:
        print("PyAV (av) not installed: the server refuses OGG_OPUS, as intended here")
    if "torch" in sys.modules:
        import torch

        cuda = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if cuda else "-"
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {cuda} ({name})")
    seconds = time.monotonic() - started
    if failures:
        print(f"IMPORT CHECK FAILED ({len(failures)}) in {seconds:.1f} s:")
        for failure in failures:
            print(f"  {failure}")
        return 1
    print(f"import check ok in {seconds:.1f} s ({len(deferred)} deferred: needs the image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

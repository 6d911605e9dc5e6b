"""For bench/gpu_check.sh --dry-run: a Python environment that holds, of this CPU venv's
packages, only those the GPU machine's image also has (bench/gpu_image.txt).

Links each such distribution's top-level files (from its RECORD, dist-info included, so
importlib.metadata sees it) into SITE_PACKAGES, the site-packages of a fresh venv made without
the venv's packages. With the carried wheels first on PYTHONPATH, that interpreter sees what
the GPU machine will, less the versions: a package in neither the image nor the carried list
fails to import there as it would on the GPU. nvidia-*-cu12 count as the image's nvidia-*.

Usage: python bench/_gpu_image_view.py SITE_PACKAGES   (run by the CPU venv's python)
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _norm(name: str) -> str:
    return re.sub(r"-cu1\d$", "", re.sub(r"[-_.]+", "-", name).lower())


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        return 2
    site = Path(sys.argv[1])
    site.mkdir(parents=True, exist_ok=True)
    lines = (BENCH / "gpu_image.txt").read_text().splitlines()
    image = {_norm(x) for x in lines if x.strip() and not x.startswith("#")}
    linked, skipped = [], []
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if _norm(name) not in image:
            skipped.append(name)
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__", "bin"}):
            source = Path(str(dist.locate_file(top)))
            link = site / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
        linked.append(f"{name}=={dist.version}")
    print(
        f"image view in {site}: {len(linked)} packages of this venv linked, {len(skipped)} left out"
    )
    print(
        "  left out (neither in the image nor needed there unless carried): "
        + ", ".join(sorted(skipped))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

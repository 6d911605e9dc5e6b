"""The GPU check's wheel lists take their versions from uv.lock.

bench/gpu_wheels.txt is carried to the GPU machine (Python 3.12) and imported from the CPU
venv by the dry run (bench/gpu_check.sh --dry-run), so each of its packages must lock to one
version for both. bench/gpu_dry_run_stand_ins.txt is pinned to what the CPU venv runs.
`--write` rewrites the lists' versions from the lock (`make lock` runs it), `--check` fails
naming every pin that differs (bench/fetch_gpu_wheels.sh runs it first; tests/e2e/test_lock.py
too). Run it with the venv's Python version.

Usage (repo root):  python bench/gpu_wheel_pins.py --check | --write
                    [--lock uv.lock] [--list FILE] [--uv .cache/uv-tool/bin/uv]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
GPU_PYTHON = "3.12"
LISTS = {
    REPO / "bench" / "gpu_wheels.txt": (VENV_PYTHON, GPU_PYTHON),
    REPO / "bench" / "gpu_dry_run_stand_ins.txt": (VENV_PYTHON,),
}
"""Each list, and the Pythons whose locked versions it must equal."""
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)")
LINUX = dict(sys_platform="linux", platform_system="Linux", platform_machine="x86_64")
LINUX |= dict(
    os_name="posix", implementation_name="cpython", platform_python_implementation="CPython"
)
"""The marker environment of the GPU machine and the CPU venv, less the Python version."""
EXPORT = "export --frozen --no-hashes --no-header --no-annotate --no-emit-project"
EXPORT += " --extra server --extra dev"  # what `make install` syncs


def locked_versions(lock: Path, uv: str, python: str) -> dict[str, set[str]]:
    """Package name -> the versions uv.lock installs with the server and dev extras (what
    `make install` syncs) for `python` on Linux x86-64. uv exports them, so its own rules for
    forks and extras decide; the markers left are evaluated here."""
    done = subprocess.run([uv, *EXPORT.split()], cwd=lock.parent, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"uv export failed: {done.stderr}")
    env = {**LINUX, "python_version": python, "python_full_version": f"{python}.0"}
    versions: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        requirement, _, marker = line.partition(";")
        match = _PIN.match(requirement.strip())
        if match and (not marker.strip() or Marker(marker).evaluate(env)):
            versions.setdefault(canonicalize_name(match["name"]), set()).add(match["version"])
    return versions


def expected_pins(lock: Path, uv: str, pythons: tuple[str, ...]) -> dict[str, str | None]:
    """Name -> the one version every one of `pythons` locks, or None where they differ."""
    per_python = [locked_versions(lock, uv, python) for python in sorted(set(pythons))]
    names = set().union(*per_python)
    pins: dict[str, str | None] = {}
    for name in names:
        found = set().union(*(p.get(name, set()) for p in per_python))
        pins[name] = next(iter(found)) if len(found) == 1 else None
    return pins


def compare(lock: Path, listing: Path, uv: str, pythons: tuple[str, ...]) -> tuple[list[str], str]:
    """(problems, the list with the lock's versions)."""
    pins = expected_pins(lock, uv, pythons)
    problems, lines = [], []
    for line in listing.read_text().splitlines(keepends=True):
        match = _PIN.match(line)
        if not match:
            lines.append(line)
            continue
        name, version = match["name"], match["version"]
        want = pins.get(canonicalize_name(name), "absent")
        if want == "absent":
            problems.append(f"{name}: not in {lock.name}")
        elif want is None:
            problems.append(f"{name}: {lock.name} locks different versions for Python {pythons}")
        elif want != version:
            problems.append(f"{name}=={version} (lock: {want})")
            line = line.replace(f"=={version}", f"=={want}", 1)
        lines.append(line)
    return problems, "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="fail if a pin differs")
    action.add_argument("--write", action="store_true", help="rewrite the pins from the lock")
    action.add_argument("--smoke", action="store_true", help="as --check (it writes nothing)")
    parser.add_argument("--lock", type=Path, default=REPO / "uv.lock")
    parser.add_argument("--list", type=Path, help="one list (as gpu_wheels.txt); default: both")
    parser.add_argument("--uv", default=str(REPO / ".cache" / "uv-tool" / "bin" / "uv"))
    args = parser.parse_args(argv)
    if not Path(args.uv).exists():
        parser.error(f"no uv at {args.uv} (make install puts it there)")
    lists = {args.list: (VENV_PYTHON, GPU_PYTHON)} if args.list else LISTS
    failed = False
    for listing, pythons in lists.items():
        problems, updated = compare(args.lock, listing, args.uv, pythons)
        unfixable = [p for p in problems if "(lock:" not in p]
        if args.write and problems and not unfixable:
            listing.write_text(updated)
            print(f"{listing}: {len(problems)} pins updated from {args.lock.name}")
        elif problems:
            print(f"{listing} differs from {args.lock}:", *problems, sep="\n  ", file=sys.stderr)
            failed = True
        else:
            print(f"{listing}: every pin is what {args.lock.name} locks")
    if failed:
        print("run `make lock` to take the lock's versions", file=sys.stderr)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())

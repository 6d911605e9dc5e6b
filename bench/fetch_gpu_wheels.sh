#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine lacks (it has no network; see
# /work/.library/device): every package in bench/gpu_wheels.txt, at its pinned version, for
# CPython 3.12 on manylinux x86-64. A package that publishes only an sdist (ChatTTS, encodec,
# docopt) gets a pure-Python wheel built from it here. Wheels already present are kept (no
# network then); wheels for anything not in the list are deleted, so only one version of each
# travels. Fails before fetching when a pin differs from uv.lock (bench/gpu_wheel_pins.py
# --check), and, saving what it fetched so far, when a package cannot be fetched.
#
# Usage (repo root):  bash bench/fetch_gpu_wheels.sh [--dest .whl] [--list bench/gpu_wheels.txt]
#   --list bench/gpu_dry_run_stand_ins.txt --dest DIR fetches the dry run's stand-ins.
# PIP_PYTHON (default .venv/bin/python, else python3) runs pip and the pin check.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
LIST=bench/gpu_wheels.txt
while (($#)); do
  case "$1" in
    --dest) DEST=$2; shift 2 ;;
    --list) LIST=$2; shift 2 ;;
    --help | -h) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch_gpu_wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PIP_PYTHON=${PIP_PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
if [ "$DEST" = .whl ]; then
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
fi
mkdir -p "$DEST"
"$PIP_PYTHON" bench/gpu_wheel_pins.py --check >/dev/null

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
quiet() { grep -v "^WARNING: Location 'file://" || true; }  # this machine's local index noise
shopt -s nocaseglob nullglob
specs=() kinds=() binaries=() sdists=()
while read -r spec _modules kind; do
  specs+=("$spec") kinds+=("${kind:-}")
done < <(sed 's/#.*//' "$LIST" | grep -v '^[[:space:]]*$')
present() {  # the wheels in $DEST for one pin (wheel names: name with _ for -, any case)
  local name=${1%%==*} version=${1#*==}
  have=("$DEST"/"${name//-/_}-${version}-"*.whl)
}
for i in "${!specs[@]}"; do
  present "${specs[$i]}"
  if ((${#have[@]} == 0)); then
    if [ "${kinds[$i]}" = sdist ]; then sdists+=("${specs[$i]}"); else binaries+=("${specs[$i]}"); fi
  fi
done
download() {
  "$PIP_PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$@" 2>&1 | quiet
}
build() { "$PIP_PYTHON" -m pip wheel -q --no-deps -w "$DEST" "$@" 2>&1 | quiet; }
# One pip run for all the missing wheels, one for all the sdists (a pip start per package cost a
# fresh clone's dry run half a minute); where one fails, a run per package, which keeps the rest
# and names the one that cannot be fetched.
if ((${#binaries[@]})) && ! download "${binaries[@]}" >/dev/null 2>&1; then
  for spec in "${binaries[@]}"; do present "$spec"; ((${#have[@]})) || download "$spec" || true; done
fi
if ((${#sdists[@]})) && ! build "${sdists[@]}" >/dev/null 2>&1; then
  for spec in "${sdists[@]}"; do present "$spec"; ((${#have[@]})) || build "$spec" || true; done
fi
keep=()
for spec in "${specs[@]}"; do
  present "$spec"
  ((${#have[@]})) || { echo "fetch_gpu_wheels.sh: could not fetch $spec" >&2; exit 1; }
  ((${#have[@]} == 1)) || { echo "fetch_gpu_wheels.sh: several wheels for $spec: ${have[*]}" >&2; exit 1; }
  keep+=("$(basename "${have[0]}")")
done
fetched=$((${#binaries[@]} + ${#sdists[@]}))

for wheel in "$DEST"/*; do
  base=$(basename "$wheel")
  if [[ " ${keep[*]} " != *" $base "* ]]; then
    echo "removing $base (not in $LIST)"
    rm -rf "$wheel"
  fi
done
echo "$DEST: ${#keep[@]} wheels for Python 3.12 ($fetched fetched now), $(du -sh "$DEST" | cut -f1)"

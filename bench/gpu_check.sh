#!/usr/bin/env bash
# One-shot check on a CUDA machine (the lent GPU: Python 3.12, torch 2.11, no network), sized
# to run in BUDGET_S (300 s) so that 15 minutes of device time hold a run and a rerun: install
# the carried wheels (.whl/, from bench/fetch_gpu_wheels.sh) and check every import within
# seconds, then the CUDA tests one file at a time (fp16 vs fp32, graphs vs eager, parity with
# upstream), then the serving benchmark (upstream first, then our server on cuda/float16 with
# CUDA graphs at 1, 16, 64, 128 and 256 streams, one wave each) while GPU memory is sampled.
# Results go to $OUT as they come, in at most 6 files: gpu_check.log (everything), gpu.md (one
# line per step as it ends, then the benchmark), serving.md (rewritten after every load level),
# gpu_memory_mib.txt. Commit gpu.md as bench/results/gpu.md.
#
# Usage (repo root):
#   bash bench/gpu_check.sh --dry-run   here, on the CPU: what needs no GPU, in under a minute
#   device run: command="OUT=$OUT bash bench/gpu_check.sh", carry=[".whl"], timeout_s=330
#   bash bench/gpu_check.sh --help | --smoke (syntax only)
# --dry-run: fetch the wheels (their pins checked against uv.lock first), fail if the tree plus
# .whl/ is over 60 MiB, install them with the GPU run's command for this machine's Python 3.12
# and import each; then the venv's Python, seeing only the packages the GPU machine will have
# (the image's, bench/gpu_image.txt, and the carried ones), imports the project and the
# benchmark, collects the CUDA test files and checks that the server goes without PyAV; then
# the budget and $OUT checks. No step of the dry run has a time limit: a loaded machine is
# slower, never failed. Env: OUT, BUDGET_S, PYTHON (GPU: python3), PYTHON312 (dry run).
set -uo pipefail
MODE=gpu
case "${1:-}" in
  --help | -h) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --smoke) bash -n "$0" && echo "gpu_check.sh: syntax ok (--smoke runs nothing; --dry-run checks the rest)"; exit 0 ;;
  --dry-run) MODE=dry ;;
  "") ;;
  *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
REPO=$PWD
TMP=$(mktemp -d /tmp/gpu_check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
if [ "$MODE" = dry ] && [ -z "${OUT:-}" ]; then OUT=/tmp/gpu_check-dry-run; rm -rf "$OUT"; fi
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
REPORT=$OUT/gpu.md

# -- the GPU run's budget: every step's cap, which together must fit BUDGET_S ------------------
MAX_BUDGET_S=300  # 15 min of device time = 2 x (machine start ~2 min + this + transfers)
BUDGET_S=${BUDGET_S:-$MAX_BUDGET_S}
CAP_INSTALL=30 CAP_IMPORTS=30 CAP_TEST=35 CAP_BENCH=130
TEST_FILES=(tests/model/test_cuda.py tests/model/test_llama_parity.py tests/model/test_generation_parity.py)
MAX_OUT_FILES=6    # 8 files come back from $OUT; 2 spare for a step killed mid-write
MAX_OUT_MIB=16     # per file
MAX_CARRY_MIB=60   # the tree plus .whl/; the device's limit is 64 MiB
check_budget() {
  local planned=$((CAP_INSTALL + CAP_IMPORTS + ${#TEST_FILES[@]} * CAP_TEST + CAP_BENCH))
  echo "budget: install ${CAP_INSTALL} + imports ${CAP_IMPORTS} + ${#TEST_FILES[@]} test files x ${CAP_TEST}" \
    "+ bench ${CAP_BENCH} = ${planned} s planned, BUDGET_S ${BUDGET_S}, at most ${MAX_BUDGET_S}"
  if ((planned > BUDGET_S || BUDGET_S > MAX_BUDGET_S)); then
    echo "BUDGET CHECK FAILED: the steps' caps must fit BUDGET_S, and BUDGET_S ${MAX_BUDGET_S} s"
    return 1
  fi
}
check_out() {
  local files n bad=0
  mapfile -t files < <(find "$OUT" -type f | sort)
  n=${#files[@]}
  echo "\$OUT holds $n files (at most ${MAX_OUT_FILES}):"
  for f in "${files[@]}"; do
    local rel=${f#"$OUT"/} size
    size=$(stat -c %s "$f")
    echo "  $rel ($((size / 1024)) KiB)"
    if ((size > MAX_OUT_MIB * 1048576)); then echo "  ^ over ${MAX_OUT_MIB} MiB"; bad=1; fi
    if [[ $rel == */*/*/* || ! $rel =~ ^[A-Za-z0-9._/-]+$ ]]; then echo "  ^ too deep or an odd name"; bad=1; fi
  done
  if ((n > MAX_OUT_FILES || bad)); then echo "OUT CHECK FAILED"; return 1; fi
}
check_budget || exit 1

# -- steps --------------------------------------------------------------------------------------
DEADLINE=$((SECONDS + BUDGET_S))
# step NAME CAP CMD...: runs CMD, its output inline in the log, and adds a line to gpu.md when
# it ends. The GPU run gives it min(CAP, time left) as its timeout; the dry run none.
step() {
  local name=$1 cap=$2 left rc t0=$SECONDS
  shift 2
  left=$((DEADLINE - SECONDS))
  if [ "$MODE" = dry ]; then
    echo "== $name: $*"
    "$@"
  elif ((left < 10)); then
    echo "== $name: SKIPPED (out of time)"; echo "- $name: skipped, out of time" >>"$REPORT"
    return 124
  else
    ((cap > left)) && cap=$left
    echo "== $name (timeout ${cap}s): $*"
    timeout -k 5 "$cap" "$@"
  fi
  rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  echo "- $name: rc=$rc in $((SECONDS - t0)) s$( ((rc == 124)) && echo ' (timed out)')" >>"$REPORT"
  return $rc
}
# The carried wheels, offline, into a --target folder (then first on PYTHONPATH).
PIP_INSTALL=(-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
             --disable-pip-version-check --root-user-action=ignore)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
PROJECT_PATH="$REPO/client:$REPO/server:$REPO/tools"

run_bench() {  # PYTHON
  local logs=$TMP/bench-logs rc peak
  (while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) \
    >"$OUT/gpu_memory_mib.txt" 2>/dev/null &
  local sampler=$!
  step bench_serving "$CAP_BENCH" "$1" bench/bench_serving.py --device cuda --dtype float16 \
    --modes default --model full --tokens 200 --concurrency 1,16,64,128,256 --requests 1 \
    --upstream-requests 2 --max-streams 256 --server-arg=--max-queue=256 --server-timeout 100 \
    --time-budget-s $((CAP_BENCH - 30)) --out "$OUT" --logs "$logs"
  rc=$?
  kill "$sampler" 2>/dev/null
  for log in "$logs"/server-*.log; do
    [ -f "$log" ] && { echo "== tail of $(basename "$log")"; tail -n 60 "$log"; }
  done
  peak=$(sort -n "$OUT/gpu_memory_mib.txt" 2>/dev/null | tail -1)
  echo "- peak GPU memory in use while benchmarking: ${peak:-n/a} MiB" >>"$REPORT"
  [ -f "$OUT/serving.md" ] && { echo; cat "$OUT/serving.md"; } >>"$REPORT"
  return $rc
}

stop() {  # WHY: the long steps would fail the same way; say so in gpu.md and end here
  echo "== stopped: $1"; echo "- stopped: $1 (see gpu_check.log)" >>"$REPORT"; exit 1
}
{ echo "# GPU check ($MODE run, $(date -u +%FT%TZ))"; echo; } >"$REPORT"
echo "== $MODE run at $(date -u +%FT%TZ) in $REPO, results in $OUT"
failed=0

if [ "$MODE" = gpu ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  PY=${PYTHON:-python3}
  $PY --version
  SITE=$TMP/site
  shopt -s nullglob
  wheels=(.whl/*.whl)
  shopt -u nullglob
  if ((${#wheels[@]})); then
    step install "$CAP_INSTALL" $PY "${PIP_INSTALL[@]}" --target "$SITE" "${wheels[@]}" || stop "the install failed"
    # The carried wheels must win over the image's transformers 5 and huggingface-hub 1.x.
    export PYTHONPATH="$SITE:$PROJECT_PATH"
    step imports "$CAP_IMPORTS" $PY bench/_gpu_imports.py --target "$SITE" || stop "the import check failed"
  else
    # No carried wheels and no network: only a machine with everything installed can go on.
    echo "no .whl/ here: checking the installed packages (never installing online)"
    export PYTHONPATH="$PROJECT_PATH"
    step imports "$CAP_IMPORTS" $PY bench/_gpu_imports.py ||
      stop "packages missing and no .whl/: run bench/fetch_gpu_wheels.sh where pip works, carry .whl"
  fi
  # The benchmark's full-size random weights, built on the CPU cores while the tests use the GPU.
  timeout 120 $PY -c "from chattts_server.devmodel.assets import build_dev_assets as b; print('full dev model:', b('full', '.cache/dev-models'))" &
  assets=$!
  # Each test file on its own, so a failure (say an fp16 near-tie) hides no other file.
  for f in "${TEST_FILES[@]}"; do
    name=$(basename "$f" .py)
    CHATTTS_TEST_DEVICE=cuda step "$name" "$CAP_TEST" $PY -m pytest -v -p no:cacheprovider -rs "$f" || failed=1
  done
  wait "$assets" || echo "building the full dev model failed; bench_serving will try again"
  run_bench "$PY" || failed=1
else
  # -- the dry run: what the GPU run does, minus the GPU and the long steps ------------------------
  VENV_PY=$REPO/.venv/bin/python
  [ -x "$VENV_PY" ] || { echo "no .venv: run make install first"; exit 1; }
  PY312=${PYTHON312:-}
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    [ -n "$PY312" ] && break
    "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && PY312=$candidate
  done
  [ -n "$PY312" ] || { echo "DRY RUN FAILED: no Python 3.12 on this machine (set PYTHON312)"; exit 1; }
  echo "Python 3.12 (as on the GPU machine): $PY312; the CPU venv: $($VENV_PY --version)"
  STANDINS=.cache/gpu-dry-stand-ins-cp312
  step fetch 0 bash -c "bash bench/fetch_gpu_wheels.sh && bash bench/fetch_gpu_wheels.sh --list bench/gpu_dry_run_stand_ins.txt --dest $STANDINS" || exit 1

  # What travels: tracked and untracked-but-not-ignored files, plus the carried .whl/.
  tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
  whl_bytes=$(du -sb .whl | cut -f1)
  carry_mib=$(((tree_bytes + whl_bytes) / 1048576))
  echo "what travels: tree $((tree_bytes / 1024)) KiB + .whl $((whl_bytes / 1024)) KiB = ${carry_mib} MiB (at most ${MAX_CARRY_MIB})"
  echo "- travels: tree $((tree_bytes / 1024)) KiB + .whl/ $((whl_bytes / 1024)) KiB = ${carry_mib} MiB (limit ${MAX_CARRY_MIB})" >>"$REPORT"
  ((carry_mib <= MAX_CARRY_MIB)) || { echo "SIZE CHECK FAILED: ${carry_mib} MiB would travel"; exit 1; }

  # Python 3.12, as on the GPU machine: the same install, then every carried import that does
  # not need torch (the stand-ins, behind the carried wheels, are the image's numpy & co.).
  step install "$CAP_INSTALL" "$PY312" "${PIP_INSTALL[@]}" --target "$TMP/site312" .whl/*.whl || exit 1
  "$PY312" "${PIP_INSTALL[@]}" --target "$TMP/stand-ins312" "$STANDINS"/*.whl || exit 1
  PYTHONPATH="$TMP/site312:$PROJECT_PATH:$TMP/stand-ins312" \
    step imports_py312 "$CAP_IMPORTS" "$PY312" bench/_gpu_imports.py --target "$TMP/site312" --outside-image || exit 1

  # The venv's Python, its site-packages only what the GPU machine will have (linked from the
  # venv, whose versions are the pins): every import, the test files' collection, no PyAV.
  "$VENV_PY" bench/_gpu_imports.py --link-image-view "$TMP/image" || exit 1
  PYTHONPATH="$PROJECT_PATH" step imports_image "$CAP_IMPORTS" "$VENV_PY" -S bench/_gpu_imports.py \
    --image-view "$TMP/image" --collect "${TEST_FILES[@]}" || failed=1
fi

check_budget || failed=1
check_out || failed=1
echo "== done: $MODE run $( ((failed)) && echo FAILED || echo ok) in $SECONDS s"
echo "- $MODE run $( ((failed)) && echo FAILED || echo ok) in $SECONDS s" >>"$REPORT"
exit $failed

#!/usr/bin/env bash
# One-shot check on a CUDA machine (e.g. the lent H200; python 3.12, no network). Installs what
# is missing, runs the CUDA tests (parity vs upstream in fp32; fp16 vs fp32: codes and
# last-hidden SNR; CUDA graphs vs eager), then the serving benchmark with the server on
# cuda/float16 with CUDA graphs at 1, 16, 64, 128 and 256 streams, sampling GPU memory while it
# runs. Everything (logs, serving.md/png, gpu.md) lands in $OUT; commit gpu.md and the PNG as
# bench/results/gpu.md and bench/results/gpu.png. Fits in BUDGET_S (default 540 s): each step
# has a timeout, and all share one overall deadline.
#
# Usage (repo root):  OUT=/tmp/out bash bench/gpu_check.sh   [BUDGET_S=540 TOKENS=200]
# On the lent machine (no network): first `bash bench/fetch_gpu_wheels.sh` here, then
#   device run: command="OUT=$OUT bash bench/gpu_check.sh", carry=[".whl"], timeout_s=600
# `bash bench/gpu_check.sh --help` prints this; `--smoke` checks the script's own syntax only.
set -u
case "${1:-}" in
  --help | -h) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --smoke) bash -n "$0" && echo "gpu_check.sh: syntax ok (--smoke runs nothing on a GPU)"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
TOKENS=${TOKENS:-200}
CONCURRENCY=${CONCURRENCY:-1,16,64,128,256}
DEADLINE=$((SECONDS + BUDGET_S))
export PYTHONPATH="$PWD/client:$PWD/server${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# The server sets this itself on CUDA when unset; set here too for the test processes.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

# step NAME MAX_SECONDS CMD...: runs CMD with min(MAX_SECONDS, time left) as its timeout.
step() {
  local name=$1 max=$2 left rc
  shift 2
  left=$((DEADLINE - SECONDS))
  if ((left < 20)); then echo "== $name: SKIPPED (out of time)"; return 124; fi
  ((max > left)) && max=$left
  echo "== $name (timeout ${max}s): $*"
  local t0=$SECONDS
  timeout -k 10 "$max" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

echo "== machine"; date; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
$PY --version

# The lent machine has no network: carry the missing wheels (bench/fetch_gpu_wheels.sh fills
# .whl/ here; pass carry=[".whl"]). Elsewhere, install the project normally.
if [ -d .whl ]; then
  step install 180 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl
  # /tmp/site must win over the image's transformers 5 and huggingface-hub 1.x.
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
elif ! $PY -c "import torch, torchaudio, ChatTTS, transformers, grpc_health, grpc_reflection, matplotlib, pytest" 2>/dev/null; then
  step install 240 $PY -m pip install -q -e ".[server,dev]" matplotlib
fi
$PY - <<'PYEOF' | tee "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0))
PYEOF

# CUDA tests: our Llama vs transformers, engine codes vs upstream ChatTTS with both sides on CUDA
# (fp32), and tests/test_cuda.py (fp16 vs fp32 codes and hidden-state SNR, graphs vs eager).
CHATTTS_TEST_DEVICE=cuda step tests 170 $PY -m pytest -q -x -p no:cacheprovider -rs \
  tests/test_cuda.py tests/test_llama_parity.py tests/test_generation_parity.py
tests_rc=$?

# GPU memory, sampled every second while the benchmark runs.
(while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) \
  >"$OUT/gpu_memory_mib.txt" 2>/dev/null &
sampler=$!
# Serving benchmark: server on cuda/fp16 with CUDA graphs (its defaults), upstream ChatTTS on cuda.
step bench_serving 330 $PY bench/bench_serving.py --device cuda --dtype float16 --modes none \
  --model full --tokens "$TOKENS" --concurrency "$CONCURRENCY" --requests 256 \
  --upstream-requests 2 --max-streams 256 --server-arg=--max-queue=256 \
  --server-timeout 240 --out "$OUT"
bench_rc=$?
kill "$sampler" 2>/dev/null

peak=$(sort -n "$OUT/gpu_memory_mib.txt" 2>/dev/null | tail -1)
{
  echo "# GPU check"
  echo
  echo '```'; cat "$OUT/env.txt"; echo '```'
  echo
  echo "- tests (CUDA parity, fp16 vs fp32, graphs vs eager): rc=$tests_rc; see gpu_check.log"
  echo "- serving benchmark: rc=$bench_rc; peak GPU memory in use: ${peak:-?} MiB"
  echo
  [ -f "$OUT/serving.md" ] && cat "$OUT/serving.md"
} >"$OUT/gpu.md"
[ -f "$OUT/serving.png" ] && cp "$OUT/serving.png" "$OUT/gpu.png"
echo "== summary: tests rc=$tests_rc, bench_serving rc=$bench_rc, $((SECONDS))s"
cat "$OUT/gpu.md"
exit $((tests_rc != 0 || bench_rc != 0))

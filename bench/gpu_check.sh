#!/usr/bin/env bash
# One-shot check on a CUDA machine (e.g. the lent H200; python 3.12, maybe only PyPI reachable).
# Installs what is missing, runs the parity tests on CUDA, then the serving benchmark with the
# server on cuda/bfloat16. Everything (logs, serving.md/png) lands in $OUT. Fits ~8 minutes:
# each step has a timeout, and all of them share one overall deadline.
#
# Usage (repo root):  OUT=/tmp/out bash bench/gpu_check.sh   [BUDGET_S=470 TOKENS=200 REQUESTS=16]
# On the lent machine (no network): first `bash bench/fetch_gpu_wheels.sh` here, then
#   device run: command="OUT=$OUT bash bench/gpu_check.sh", carry=[".whl"], timeout_s=540
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-470}
TOKENS=${TOKENS:-200}
REQUESTS=${REQUESTS:-16}
DEADLINE=$((SECONDS + BUDGET_S))
export PYTHONPATH="$PWD/client:$PWD/server${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

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
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
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

# Parity: our Llama vs transformers (CPU-only test file), and engine codes vs upstream ChatTTS
# with both sides on CUDA (fp32; greedy codes can flip on near-ties if kernels differ).
CHATTTS_TEST_DEVICE=cuda step parity 150 $PY -m pytest -q -x -p no:cacheprovider \
  tests/test_llama_parity.py tests/test_generation_parity.py
parity_rc=$?

# Serving benchmark: server on cuda/bf16 (one linear mode there), upstream ChatTTS on cuda.
step bench_serving 330 $PY bench/bench_serving.py --device cuda --dtype bfloat16 --modes none \
  --tokens "$TOKENS" --requests "$REQUESTS" --upstream-requests 3 --concurrency 1,4,16 \
  --server-timeout 240 --out "$OUT"
bench_rc=$?

echo "== summary: parity rc=$parity_rc, bench_serving rc=$bench_rc, $((SECONDS))s"
[ -f "$OUT/serving.md" ] && cat "$OUT/serving.md"
exit $((parity_rc != 0 || bench_rc != 0))

#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine lacks (it has no network; see
# /work/.library/device). Its image has Python 3.12 with torch/torchaudio 2.11, numba, numpy,
# prometheus-client, matplotlib, pytest and hypothesis; everything else the server needs is carried
# in .whl/ (git-ignored via .git/info/exclude) and installed by bench/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$@"
}
# Pure-Python or abi3/cp312 wheels, pinned to what the CPU venv runs.
fetch "transformers==4.57.6" "tokenizers==0.22.2" "vocos==0.1.0" "vector-quantize-pytorch==1.32.0" \
  "einx==0.4.3" frozendict loguru torch-einops-utils "pybase16384==0.3.9" "grpcio==1.85.3" \
  "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" "grpcio-status==1.85.3" \
  googleapis-common-protos "protobuf==7.36.2" "soxr==1.1.0" "soundfile==0.14.0" "av==18.1.0" \
  "safetensors==0.8.0" "huggingface-hub<1.0" num2words docopt cn2an proces \
  "wetext==0.1.8" "kaldifst==1.8.3" contractions textsearch anyascii pyahocorasick
# ChatTTS and encodec publish only sdists: build pure-Python wheels from them here.
python3 -m pip wheel -q --no-deps -w .whl "chattts==0.2.5" "encodec==0.1.1"
du -sh .whl

#!/usr/bin/env bash
# llama.cpp's CPU backend (libggml-cpu.so.0) built a second time for an AVX2-only CPU (AMD EPYC
# Rome/Milan; ggml's haswell level: AVX2, FMA, F16C, BMI2; no AVX-512, no VNNI), from the source
# llama-cpp-python's own build used (uv keeps it in its cache), into OUT_DIR.
#
# A process with OUT_DIR first in LD_LIBRARY_PATH loads this backend instead of the native one
# (llama-cpp-python's libraries find each other by RUNPATH, which LD_LIBRARY_PATH overrides):
# the tests and benchmarks run llama.cpp as an AVX2-only machine would, on any x86-64 machine
# (tests/model/test_cpu_kinds.py). `make install` runs this once per llama-cpp-python version.
#
# Usage: tools/build_ggml_avx2.sh UV_CACHE_DIR LLAMA_CPP_VERSION OUT_DIR
#        tools/build_ggml_avx2.sh --help
set -euo pipefail

if [[ "${1:-}" == "--help" || $# -ne 3 ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    [[ "${1:-}" == "--help" ]] && exit 0 || exit 2
fi
cache=$1 version=$2 out=$3

source_dir=$(ls -d "$cache"/sdists-*/pypi/llama-cpp-python/"$version"/*/src/vendor/llama.cpp 2>/dev/null | head -1 || true)
if [[ -z "$source_dir" ]]; then
    echo "build_ggml_avx2: no llama-cpp-python $version source in $cache; skipped" >&2
    exit 1
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_OPENMP=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >"$build/configure.log" 2>&1 \
    || { tail -20 "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target ggml-cpu >"$build/build.log" 2>&1 \
    || { tail -20 "$build/build.log" >&2; exit 1; }
mkdir -p "$out"
cp -L "$build/bin/libggml-cpu.so.0" "$out/libggml-cpu.so.0.tmp"
mv "$out/libggml-cpu.so.0.tmp" "$out/libggml-cpu.so.0"
echo "build_ggml_avx2: $out/libggml-cpu.so.0 (llama-cpp-python $version, AVX2 only)"

# chattts-stream: `make run` serves ChatTTS (the official weights, else the dev model), `make test`
# runs every test. Both install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 50051
HTTP_PORT ?= 8000
# make run: the official weights (MODEL, at the revision the server pins), from the Hugging Face
# cache, fetched and sha-checked first where the hub answers within 5 s; where they cannot be
# (offline, hub unreachable, disk full) the tiny dev model, with one line saying why.
# DEV_MODEL=tiny (or full) serves that random-weight dev model straight away.
MODEL ?= 2Noise/ChatTTS
DEV_MODEL ?=
RUN_MODEL = $(if $(DEV_MODEL),--dev-model $(DEV_MODEL),--model $(MODEL) --dev-model-fallback --hub-timeout-s 5)
PYTEST_ARGS ?=
# make test: the suite on TEST_WORKERS pytest-xdist workers, then the `serial` tests alone, which
# assert timing ratios under loads they make themselves. Each phase prints its 20 slowest tests.
# Three workers on two cores: many tests wait on sockets, sleeps and subprocess servers starting
# (on a 2-core EPYC, phase one took 10:16 with 2 workers and 7:13 with 3 at 800 tests). At 1,390
# tests a fresh clone took 11:52 with 3 and 13:35 with 4, which also made a test's race show.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest --durations=20

.PHONY: install install-python lock llama-build-args browser ffmpeg proxy run test proto lint bench clean

install: $(STAMP)

# Every package in .venv comes from uv.lock, at the version and hash it records (transitive ones
# included); `uv sync --locked` fails when pyproject.toml and the lock disagree, and removes
# whatever the lock does not list. uv itself is pinned here and installed into .cache/uv-tool;
# what it downloads and builds stays in .cache/uv, so a second install takes seconds.
UV_VERSION := 0.13.9
PACKAGING_VERSION := 26.4
UV := .cache/uv-tool/bin/uv
export UV_CACHE_DIR ?= $(CURDIR)/.cache/uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/$(VENV)

$(UV):
	$(PYTHON) -m venv .cache/uv-tool
	.cache/uv-tool/bin/python -m pip install --quiet --disable-pip-version-check \
	  "uv==$(UV_VERSION)" "packaging==$(PACKAGING_VERSION)"

# llama.cpp (the `llamacpp` extra) builds from source for this CPU: ggml's -march=native, with
# OpenMP (ggml's own pool waits at its barriers by spinning, and two busy replicas of it on
# shared cores slowed each other 19x; libgomp spins GOMP_SPINCOUNT, which threads.py bounds,
# then sleeps). The CPU's flags are one of the build's settings, so uv's cache (.cache/uv) keeps
# one wheel per kind of CPU and a second install reuses it. A build that fails leaves the install
# without it: the GPT then runs on torch fp32 and the server says why.
LLAMA_CPU_KEY = $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)
LLAMA_BUILD = --config-settings-package "llama-cpp-python:cmake.define.GGML_OPENMP=ON" \
	--config-settings-package "llama-cpp-python:cmake.define.CHATTTS_CPU_KEY=$(LLAMA_CPU_KEY)"
# The interpreter itself, not a pyenv shim in front of it: uv takes a venv made from the
# interpreter as not satisfying a request for the shim's path, and replaced .venv (rebuilding
# llama.cpp and every sdist) on every second install.
INSTALL_PYTHON = $(shell $(PYTHON) -c 'import sys; print(sys.executable)')
SYNC = $(UV) sync --locked --extra server --extra dev --python "$(INSTALL_PYTHON)"

# llama.cpp's CPU backend built again for an AVX2-only CPU (tools/build_ggml_avx2.sh): the tests
# run llama.cpp as that CPU on any machine by putting this folder first in LD_LIBRARY_PATH
# (tests/model/test_cpu_kinds.py). Once per llama-cpp-python version (about a minute on 2
# cores); where it cannot be built those tests are skipped and say why.
LLAMA_CPP_VERSION = $(shell sed -n 's/^llamacpp = \["llama-cpp-python==\([0-9.]*\)"\]/\1/p' pyproject.toml)
GGML_AVX2 = .cache/ggml-avx2/$(LLAMA_CPP_VERSION)

# What `uv sync` must be told to find the built llama.cpp up to date (tests/e2e/test_lock.py).
llama-build-args:
	@echo $(LLAMA_BUILD)

install-python:
	@echo $(INSTALL_PYTHON)

# A first install downloads torch 2.9.1 with its CUDA libraries (PyPI has no CPU-only build of it
# for x86-64): about 8 GiB in .cache/uv, which .venv hard-links. Say so up front when the disk
# has less, since uv's own error is only "No space left on device" partway through.
INSTALL_NEEDS_KIB := 9000000
$(STAMP): pyproject.toml uv.lock | $(UV)
	@free=$$(df -Pk . | awk 'NR == 2 {print $$4}'); \
	if [ ! -d $(UV_CACHE_DIR)/archive-v0 ] && [ "$$free" -lt $(INSTALL_NEEDS_KIB) ]; then \
	  echo "make install: $$((free / 1048576)) GiB free here; a first install needs about 9 GiB" \
	    "(torch's CUDA wheels, which PyPI's torch 2.9.1 depends on)"; fi
	$(SYNC) --extra llamacpp $(LLAMA_BUILD) || { \
	  echo "make install: llama-cpp-python did not build; the GPT will run on torch fp32"; \
	  $(SYNC); }
	@[ -f $(GGML_AVX2)/libggml-cpu.so.0 ] || bash tools/build_ggml_avx2.sh $(UV_CACHE_DIR) \
	  $(LLAMA_CPP_VERSION) $(GGML_AVX2) || echo "make install: no AVX2-only llama.cpp backend;" \
	  "tests/model/test_cpu_kinds.py will be skipped"
	touch $(STAMP)

# Refresh the lock after editing pyproject.toml (or to take newer releases: make lock
# LOCK_ARGS=--upgrade), then the GPU wheel list's versions from it. Commit uv.lock and
# bench/gpu_wheels.txt together.
LOCK_ARGS ?=
lock: | $(UV)
	$(UV) lock $(LOCK_ARGS)
	.cache/uv-tool/bin/python bench/gpu_wheel_pins.py --write

# The playground test drives Debian's Chromium; install it (as root, apt-get) when missing. If
# it cannot be installed the test is skipped and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
	  || echo "make browser: chromium could not be installed; the playground test will be skipped"; \
	else echo "make browser: no root apt-get; the playground test will be skipped"; fi

# The subtitle test converts our WebVTT and SRT files with the ffmpeg command (PyAV's demuxers
# read them either way); install it the same way when missing, else that one test is skipped.
ffmpeg:
	@if command -v ffmpeg >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ffmpeg \
	  || echo "make ffmpeg: ffmpeg could not be installed; its subtitle test will be skipped"; \
	else echo "make ffmpeg: no root apt-get; the ffmpeg subtitle test will be skipped"; fi

# The replica tests (tests/e2e/test_haproxy_replicas.py) run Debian's HAProxy in front of three
# replicas; install it (as root, apt-get) when missing. Without it those tests are skipped and say
# why.
proxy:
	@if command -v haproxy >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy \
	  || echo "make proxy: haproxy could not be installed; the proxy tests will be skipped"; \
	else echo "make proxy: no root apt-get; the proxy tests will be skipped"; fi

run: install
	$(BIN)/chattts-server --host $(HOST) --port $(PORT) --http-port $(HTTP_PORT) $(RUN_MODEL)

# Exit 5 is "no tests collected": PYTEST_ARGS chose tests of one phase only.
test: install browser ffmpeg proxy
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not serial" $(PYTEST_ARGS) || [ $$? = 5 ]
	$(PYTEST) -m serial $(PYTEST_ARGS) || [ $$? = 5 ]

proto: install
	$(BIN)/python tools/gen_proto.py

lint: install
	$(BIN)/ruff check client server tests bench tools
	$(BIN)/ruff format --check client server tests bench tools
	$(BIN)/mypy client/chattts_client server/chattts_server tools/chattts_devtools

bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# chattts-stream: `make run` serves the dev model, `make test` runs every test. Both install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 50051
DEV_MODEL ?= tiny
PYTEST_ARGS ?=

.PHONY: install run test proto lint bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch and torchaudio first, pinned together: ChatTTS imports torchaudio, whose native
	# library must match torch exactly.
	$(BIN)/python -m pip install --quiet "torch==2.9.1" "torchaudio==2.9.1"
	$(BIN)/python -m pip install --quiet -e ".[server,dev]"
	touch $(STAMP)

run: install
	$(BIN)/chattts-server --host $(HOST) --port $(PORT) --dev-model $(DEV_MODEL)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

proto: install
	$(BIN)/python tools/gen_proto.py

lint: install
	$(BIN)/ruff check client server tests bench tools
	$(BIN)/ruff format --check client server tests bench tools
	$(BIN)/mypy client/chattts_client server/chattts_server

bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Two entry points (README quick start): `make run` and `make test`. Both bootstrap a local
# virtual environment on first use, so they work on a fresh machine with Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` needs only what `mlx` runs on; the test and lint tools come with `make test`.
RUN_STAMP := $(VENV)/.installed-run
# No BLAS setting here: `mlx` and the test session (tests/conftest.py) load an installed
# OpenBLAS themselves before MLX (mlxlaunch/blas.py); MLXLAUNCH_BLAS=reference turns it off.
MODEL ?= demo
# Claude Code: `claude` on PATH, else the release mlxlaunch pins (the version is set once, in
# mlxlaunch/launch/claude_bin.py), installed with npm on first use into mlxlaunch's home, where
# `mlx doctor` and a plain `mlx launch claude` find it afterwards.

.PHONY: run test check install completions

$(BIN)/pip:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/pip
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml | $(BIN)/pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

## Start Claude Code on a local model (default: the offline demo model; MODEL=... to choose).
run: $(RUN_STAMP)
	$(BIN)/mlx launch claude --install-claude --model $(MODEL); code=$$?; \
	echo; echo "mlx is $(abspath $(BIN))/mlx. To type plain \`mlx\`:"; \
	echo "  export PATH=\"$(abspath $(BIN)):\$$PATH\"   (this shell; or: source $(BIN)/activate)"; \
	echo "  pipx install $(CURDIR)   (or: uv tool install $(CURDIR); for your user, anywhere)"; \
	exit $$code

## The whole test suite (what CI runs).
test: $(STAMP)
	$(BIN)/python -m pytest

## Lint and type-check.
check: $(STAMP)
	$(BIN)/ruff check mlxlaunch tests
	$(BIN)/ruff format --check mlxlaunch tests
	$(BIN)/mypy

completions: $(STAMP)
	$(BIN)/mlx completions --write completions

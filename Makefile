# Two entry points (README quick start): `make run` and `make test`. Both bootstrap a local
# virtual environment on first use, so they work on a fresh machine with Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# MLX's Linux CPU wheel links the reference BLAS; an optimised OpenBLAS, when present, makes
# matmul ~33x faster (see shared FACTS). Used if installed, never required.
OPENBLAS := $(wildcard /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0)
BLAS_ENV := $(if $(OPENBLAS),LD_PRELOAD=$(firstword $(OPENBLAS)),)
MODEL ?= demo
CLAUDE_CODE_VERSION := 2.1.332
# `claude` from PATH, else a pinned copy installed locally with npm on first use.
CLAUDE_BIN := $(or $(shell command -v claude 2>/dev/null),.cache/claude/node_modules/.bin/claude)

.PHONY: run test check install completions

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## Start Claude Code on a local model (default: the offline demo model; MODEL=... to choose).
run: $(STAMP) $(CLAUDE_BIN)
	$(BLAS_ENV) $(BIN)/mlx launch claude --model $(MODEL) --claude-bin $(CLAUDE_BIN)

.cache/claude/node_modules/.bin/claude:
	npm install --prefix .cache/claude --no-audit --no-fund @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)

## The whole test suite (what CI runs).
test: $(STAMP)
	$(BLAS_ENV) $(BIN)/python -m pytest

## Lint and type-check.
check: $(STAMP)
	$(BIN)/ruff check mlxlaunch tests
	$(BIN)/ruff format --check mlxlaunch tests
	$(BIN)/mypy

completions: $(STAMP)
	$(BIN)/mlx completions --write completions

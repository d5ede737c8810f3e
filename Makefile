# Entry points (README quick start): `make run`, `make test` (the quick tier) and `make test-all`
# (everything, what CI runs after it). All bootstrap a local virtual environment on first use, so
# they work on a fresh machine with Python 3.11+. The tiers are in tests/tiers.py.
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

.PHONY: run test test-all check install completions

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

# Property tests try a tenth of their examples in `make test`, all of them in `make test-all`
# (tests/hypothesis_profiles.py); set HYPOTHESIS_PROFILE to choose. Tests run in TEST_WORKERS
# pytest-xdist processes (most wait on child processes and servers, so 2 beat 1 even on 2
# cores; 0: one process): each module's tests share a worker, and so do the e2e tests and the
# cluster tests (xdist_group, tests/conftest.py). PYTEST_ARGS adds options.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

## The quick tier: unit tests and a few smoke tests through the real path (a few minutes).
test: $(STAMP)
	@HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-dev} $(PYTEST) -m "not slow" \
		$(PYTEST_ARGS); code=$$?; \
	echo "make test ran the quick tier. Everything (model-backed, end-to-end with Claude Code," \
		"Codex and opencode, cluster, fuzz): make test-all"; \
	exit $$code

## Everything: the quick tier and the slow one (what CI runs after `make test`).
test-all: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PYTEST) $(PYTEST_ARGS)

## Lint and type-check.
check: $(STAMP)
	$(BIN)/ruff check mlxlaunch tests
	$(BIN)/ruff format --check mlxlaunch tests
	$(BIN)/mypy

completions: $(STAMP)
	$(BIN)/mlx completions --write completions

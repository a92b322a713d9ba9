# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test test-slow lint bench multi30k clean install

# torch first and pinned: an unpinned torch pulls several GB of CUDA packages.
$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e ".[dev,serve,interop,bench]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/aiayn demo

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/cpu_train.py
	$(BIN)/python benchmarks/cpu_decode.py

multi30k: $(VENV)/.installed
	bash scripts/multi30k.sh

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache

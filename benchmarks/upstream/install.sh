#!/usr/bin/env bash
# Build the upstream endpoint picker from its Go module, to run beside ours.
#
#   benchmarks/upstream/install.sh [DIR]     # default .upstream; the binary is DIR/bin/epp
#
# Builds sigs.k8s.io/gateway-api-inference-extension v1.5.0 cmd/epp, pinned by the go.mod/go.sum
# beside this script (see its comment for why that version). llm-d's inference simulator is not
# built: the Go module proxy refuses github.com/llm-d modules.
#
# Cached: a second run with the same pins and the same Go finds DIR/bin/.built and does nothing.
# Exits 0 with one "skipped" line when Go (>= 1.26) or the Go module proxy is unavailable; exits
# non-zero when a build that started breaks half way. Prints its time and the disk it used.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091  # kind/go-build.sh, checked on its own
source "$HERE/../../kind/go-build.sh"
go_build_start "upstream EPP" "${1:-.upstream}"
VERSION="v1.5.0"

PINS="$(go_build_pins "$HERE/go.mod" "$HERE/go.sum" "${BASH_SOURCE[0]}")"
if [ -x "$BIN/epp" ] && [ "$(cat "$BIN/.built" 2>/dev/null)" = "$PINS" ]; then
    echo "install.sh: $BIN/epp is the upstream EPP $VERSION ($GO_VERSION)"
    exit 0
fi
rm -f "$BIN/.built"

go_build_download "$HERE"
echo "install.sh: building (≈ 5 min on 2 cores the first time)"

# -N -l as for the control plane: less compile time; a benchmark compares CPU per request, so the
# figures say which build they ran.
(cd "$HERE" && CGO_ENABLED=0 go build -trimpath -gcflags="all=-N -l" -ldflags="-s -w" -o "$BIN/" \
    sigs.k8s.io/gateway-api-inference-extension/cmd/epp) \
    || fail "go build in benchmarks/upstream broke; see the errors above"
"$BIN/epp" --help >/dev/null 2>&1 || fail "the upstream EPP was built but does not run"
echo "$PINS" > "$BIN/.built"
echo "install.sh: built the upstream EPP $VERSION into $BIN in $((SECONDS - START_S)) s;" \
    "binary $(du -sh "$BIN/epp" | cut -f1), Go build cache $(du -sh "$(go env GOCACHE)" 2>/dev/null | cut -f1)"

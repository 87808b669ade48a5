# shellcheck shell=bash
# What the two Go builds share (kind/controlplane/install.sh, benchmarks/upstream/install.sh):
# their output folder, their skip and fail lines, the Go version check, the pins stamp and the
# module download. Sourced, not run:
#
#   source kind/go-build.sh; go_build_start "control plane" "${1:-.controlplane}"
#
# A skip exits 0 with one line (no Go, an old Go, no module proxy: CI without them still passes
# and the tiers that need the build skip themselves); a failure exits 1.

skip() {
    echo "install.sh: skipped, $GO_BUILD_WHAT not built: $*" >&2
    exit 0
}

fail() {
    echo "install.sh: FAILED: $*" >&2
    exit 1
}

# go_build_start WHAT DIR: BIN (DIR/bin, absolute), START_S and GO_VERSION set for the script that
# sourced this, or a skip naming WHAT.
go_build_start() {
    GO_BUILD_WHAT="$1"
    mkdir -p "$2/bin" || fail "cannot create $2/bin"
    # shellcheck disable=SC2034  # BIN and START_S are the sourcing script's
    BIN="$(cd "$2/bin" && pwd)"
    START_S=$SECONDS
    command -v go >/dev/null || skip "no go on PATH (Go >= 1.26 is needed)"
    GO_VERSION="$(go env GOVERSION)"
    case "$GO_VERSION" in
        go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
        *) skip "Go >= 1.26 is needed (found $GO_VERSION)" ;;
    esac
}

# go_build_pins FILE...: the stamp BIN/.built holds once a build of these inputs succeeded (their
# hash, this file's included, and the Go version).
go_build_pins() {
    echo "$(cat "$@" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16) $GO_VERSION"
}

# go_build_download MODULE_DIR: the modules of MODULE_DIR's go.mod, or a skip naming it.
go_build_download() {
    (cd "$1" && go mod download) >/dev/null 2>&1 \
        || skip "the Go module proxy did not serve the modules of $1 ($(go env GOPROXY))"
    echo "install.sh: modules downloaded in $((SECONDS - START_S)) s"
}

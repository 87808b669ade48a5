#!/usr/bin/env bash
# Build a local Kubernetes control plane from its Go modules, for the cluster test tier.
#
#   kind/controlplane/install.sh [DIR]     # default .controlplane; binaries in DIR/bin
#
# Builds, from the versions pinned by the go.mod/go.sum beside this script (one module, so that
# every library the five share is compiled once):
#   kube-apiserver, kube-controller-manager, kube-scheduler  k8s.io/kubernetes v1.37.2
#   etcd                                                     go.etcd.io/etcd/server/v3 v3.7.0
#                                                            (the etcd kubernetes v1.37.2 pins)
#   kwok (the node agent: Pods scheduled, Ready, with IPs)   sigs.k8s.io/kwok v0.8.0
# The go.mod lists the five commands as `tool`s; k8s.io/kubernetes needs the replace block that
# points its staging modules (k8s.io/api, k8s.io/client-go, ...) at their v0.37.2 releases.
#
# Cached: a second run with the same pins and the same Go finds DIR/bin/.built and does nothing;
# Go's own build cache makes a rebuild after a pin change incremental.
# Exits 0 with one "skipped" line when Go (>= 1.26) or the Go module proxy is unavailable, so CI
# without them still passes (the cluster tier then skips itself, naming this script); exits
# non-zero when a build that started breaks half way. Prints its time and the disk it used.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091  # kind/go-build.sh, checked on its own
source "$HERE/../go-build.sh"
go_build_start "control plane" "${1:-.controlplane}"
K8S_VERSION="v1.37.2"

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)
PINS="$(go_build_pins "$HERE/go.mod" "$HERE/go.sum" "$HERE/pod-ready.yaml" "${BASH_SOURCE[0]}")"
all_built() {
    local name
    for name in "${BINARIES[@]}"; do [ -x "$BIN/$name" ] || return 1; done
    [ -s "$BIN/kwok-stages.yaml" ] || return 1
    [ "$(cat "$BIN/.built" 2>/dev/null)" = "$PINS" ]
}
if all_built; then
    echo "install.sh: $BIN already has ${BINARIES[*]} ($K8S_VERSION, $GO_VERSION)"
    exit 0
fi
rm -f "$BIN/.built"

# Module downloads first, so an unreachable proxy is a skip and not a broken build.
go_build_download "$HERE"
echo "install.sh: building (≈ 15 min on 2 cores the first time)"

export CGO_ENABLED=0
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
done
# -N -l (no optimisation, no inlining): a quarter less compile time, which CI's budget needs; the
# binaries run the same code, a little slower, which a test cluster does not notice.
(cd "$HERE" && go build -trimpath -gcflags="all=-N -l" -ldflags="$LDFLAGS" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3 sigs.k8s.io/kwok/cmd/kwok) \
    || fail "go build in kind/controlplane broke; see the errors above"
mv -f "$BIN/server" "$BIN/etcd" || fail "the etcd build left no $BIN/server"
# kwok's own "fast" stages (Node Ready at once; Pod Succeeded when its containers are done, gone
# when deleted), from the kwok module the build used, and our pod-ready.yaml in place of kwok's
# (a Pod with a readiness probe is not Ready until probed, as on a real node).
STAGES="$(cd "$HERE" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage" \
    || fail "cannot find the kwok module's stages"
{
    for stage in node/fast/node-initialize pod/fast/pod-complete pod/fast/pod-delete; do
        cat "$STAGES/$stage.yaml" && echo "---"
    done
    cat "$HERE/pod-ready.yaml"
} > "$BIN/kwok-stages.yaml" || fail "cannot copy kwok's stages from $STAGES"

for name in "${BINARIES[@]}"; do
    [ -x "$BIN/$name" ] || fail "$name missing from $BIN after the build"
done
"$BIN/kube-apiserver" --version >/dev/null 2>&1 || fail "kube-apiserver was built but does not run"
echo "$PINS" > "$BIN/.built"
echo "install.sh: built ${BINARIES[*]} into $BIN in $((SECONDS - START_S)) s;" \
    "binaries $(du -sh "$BIN" | cut -f1), Go build cache $(du -sh "$(go env GOCACHE)" 2>/dev/null | cut -f1)," \
    "module cache $(du -sh "$(go env GOMODCACHE)" 2>/dev/null | cut -f1)"

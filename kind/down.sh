#!/usr/bin/env bash
# Delete the kind cluster made by kind/up.sh (and everything in it). Safe to run twice.
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-lora-epp}"

if ! command -v kind >/dev/null 2>&1; then
  printf 'kind/down.sh: kind is not installed or not on PATH (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)\n' >&2
  exit 1
fi

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  printf '==> deleting kind cluster %s\n' "$CLUSTER_NAME"
  kind delete cluster --name "$CLUSTER_NAME"
else
  printf '==> no kind cluster named %s; nothing to do\n' "$CLUSTER_NAME"
fi

#!/usr/bin/env bash
# Create a kind cluster that runs lora-epp end to end, then `pytest e2e` tests it.
#
#   kind/up.sh                      # GATEWAY=kgateway (default)
#   GATEWAY=istio kind/up.sh        # or envoy-gateway, or envoy (plain Envoy, no controller)
#
# Steps: kind cluster (kind/cluster.yaml) → build the image (Dockerfile) and load it into the
# nodes → Gateway API CRDs → our CRDs → the gateway implementation → simulated vLLM pods (kind/)
# → the InferencePool, its EPP (two replicas, leader election), InferenceModels, and the
# gateway's Gateway, route and extras, all with charts/inferencepool (kind/values.yaml) → wait
# until a request goes through.
# Safe to run again: every step applies or upgrades in place. Undo with kind/down.sh.
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-lora-epp}"
GATEWAY="${GATEWAY:-kgateway}"
NAMESPACE=default # manifests/gateway/envoy/envoy.yaml names Services in this namespace
IMAGE="${IMAGE:-lora-epp:dev}"
GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.4.0}"
KGATEWAY_VERSION="${KGATEWAY_VERSION:-v2.1.1}"
ISTIO_VERSION="${ISTIO_VERSION:-1.28.0}"
ENVOY_GATEWAY_VERSION="${ENVOY_GATEWAY_VERSION:-v1.8.1}"
ENVOY_AI_GATEWAY_VERSION="${ENVOY_AI_GATEWAY_VERSION:-v0.7.0}"
WAIT_TIMEOUT="${WAIT_TIMEOUT:-300s}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf '==> %s\n' "$*"; }
die() {
  printf 'kind/up.sh: %s\n' "$*" >&2
  exit 1
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is not installed or not on PATH ($2)"
}

check_tools() {
  need docker "https://docs.docker.com/engine/install/"
  need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
  need kubectl "https://kubernetes.io/docs/tasks/tools/"
  need helm "https://helm.sh/docs/intro/install/ (the pool and its EPP are installed with charts/inferencepool)"
  case "$GATEWAY" in
  kgateway | istio | envoy-gateway | envoy) ;;
  *) die "GATEWAY must be kgateway, istio, envoy-gateway or envoy, not '$GATEWAY'" ;;
  esac
  docker info >/dev/null 2>&1 || die "docker is installed but its daemon is not reachable (is it running? may you use it?)"
}

create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    say "kind cluster $CLUSTER_NAME exists; reusing it"
  else
    say "creating kind cluster $CLUSTER_NAME"
    kind create cluster --name "$CLUSTER_NAME" --config kind/cluster.yaml --wait 120s
  fi
  kubectl config use-context "kind-$CLUSTER_NAME" >/dev/null
}

build_image() {
  local epoch
  epoch="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
  say "building $IMAGE (SOURCE_DATE_EPOCH=$epoch)"
  docker build --build-arg SOURCE_DATE_EPOCH="$epoch" -t "$IMAGE" .
  say "loading $IMAGE into the kind nodes"
  kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"
}

install_crds() {
  say "installing Gateway API $GATEWAY_API_VERSION CRDs"
  kubectl apply --server-side --force-conflicts \
    -f "https://github.com/kubernetes-sigs/gateway-api/releases/download/$GATEWAY_API_VERSION/standard-install.yaml"
  say "installing the InferencePool / InferenceModel / InferenceObjective CRDs"
  kubectl apply --server-side --force-conflicts -f manifests/crds/
  kubectl wait --for=condition=Established --timeout=60s -f manifests/crds/
}

install_gateway_controller() {
  case "$GATEWAY" in
  kgateway)
    say "installing kgateway $KGATEWAY_VERSION (inference extension on)"
    helm upgrade -i kgateway-crds oci://cr.kgateway.dev/kgateway-dev/charts/kgateway-crds \
      --version "$KGATEWAY_VERSION" -n kgateway-system --create-namespace --wait
    helm upgrade -i kgateway oci://cr.kgateway.dev/kgateway-dev/charts/kgateway \
      --version "$KGATEWAY_VERSION" -n kgateway-system --create-namespace \
      -f manifests/gateway/kgateway/values.yaml --wait
    ;;
  istio)
    say "installing Istio $ISTIO_VERSION (inference extension on)"
    helm upgrade -i istio-base base --repo https://istio-release.storage.googleapis.com/charts \
      --version "$ISTIO_VERSION" -n istio-system --create-namespace --wait
    helm upgrade -i istiod istiod --repo https://istio-release.storage.googleapis.com/charts \
      --version "$ISTIO_VERSION" -n istio-system -f manifests/gateway/istio/values.yaml --wait
    ;;
  envoy-gateway)
    say "installing Envoy AI Gateway $ENVOY_AI_GATEWAY_VERSION and Envoy Gateway $ENVOY_GATEWAY_VERSION"
    helm upgrade -i aieg-crd oci://docker.io/envoyproxy/ai-gateway-crds-helm \
      --version "$ENVOY_AI_GATEWAY_VERSION" -n envoy-ai-gateway-system --create-namespace --wait
    helm upgrade -i aieg oci://docker.io/envoyproxy/ai-gateway-helm \
      --version "$ENVOY_AI_GATEWAY_VERSION" -n envoy-ai-gateway-system --create-namespace --wait
    helm upgrade -i eg oci://docker.io/envoyproxy/gateway-helm \
      --version "$ENVOY_GATEWAY_VERSION" -n envoy-gateway-system --create-namespace \
      -f "https://raw.githubusercontent.com/envoyproxy/ai-gateway/$ENVOY_AI_GATEWAY_VERSION/manifests/envoy-gateway-values.yaml" \
      -f manifests/gateway/envoy-gateway/values.yaml --wait
    ;;
  envoy)
    say "GATEWAY=envoy: no controller to install (Envoy is configured by epp envoy-config)"
    ;;
  esac
}

deploy_stack() {
  say "deploying the simulated vLLM pods (kind/)"
  kubectl apply -n "$NAMESPACE" -k kind/
  local provider="$GATEWAY" routes=true
  if [ "$GATEWAY" = envoy ]; then
    provider=none
    routes=false
  fi
  say "installing the pool, its EPP and its models with charts/inferencepool (provider.name=$provider)"
  # --skip-crds: install_crds applied them already, server-side, and keeps them up to date on a
  # second run (Helm installs a chart's CRDs once and never upgrades them).
  helm upgrade -i vllm-llama3-8b charts/inferencepool -n "$NAMESPACE" --skip-crds \
    -f kind/values.yaml \
    --set provider.name="$provider" \
    --set gateway.create="$routes" \
    --set httpRoute.enabled="$routes"
  if [ "$GATEWAY" = envoy ]; then
    say "deploying the plain Envoy gateway (manifests/gateway/envoy)"
    kubectl apply -n "$NAMESPACE" -k manifests/gateway/envoy
  else
    say "adding the baseline route that skips the EPP (kind/baseline-route)"
    kubectl apply -n "$NAMESPACE" -k kind/baseline-route
  fi
}

wait_ready() {
  say "waiting for the simulated pods"
  kubectl rollout status -n "$NAMESPACE" deployment/vllm-llama3-8b --timeout="$WAIT_TIMEOUT"
  say "waiting for an EPP leader (only the leader reports Ready)"
  local ready="" deadline=$((SECONDS + 300))
  until [ "${ready:-0}" -ge 1 ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "no EPP replica became Ready; see: kubectl logs -n $NAMESPACE deploy/vllm-llama3-8b-epp"
    sleep 2
    ready="$(kubectl get -n "$NAMESPACE" deployment/vllm-llama3-8b-epp -o jsonpath='{.status.readyReplicas}')"
  done
  if [ "$GATEWAY" = envoy ]; then
    kubectl rollout status -n "$NAMESPACE" deployment/inference-gateway-envoy --timeout="$WAIT_TIMEOUT"
  else
    say "waiting for Gateway inference-gateway to be programmed"
    kubectl wait -n "$NAMESPACE" --for=condition=Programmed gateway/inference-gateway --timeout="$WAIT_TIMEOUT"
  fi
}

gateway_service() {
  # namespace/name of the Service in front of the gateway's Envoy pods.
  case "$GATEWAY" in
  kgateway) echo "$NAMESPACE/inference-gateway" ;;
  istio) echo "$NAMESPACE/inference-gateway-istio" ;;
  envoy) echo "$NAMESPACE/inference-gateway-envoy" ;;
  envoy-gateway)
    local name
    name="$(kubectl get svc -n envoy-gateway-system \
      -l "gateway.envoyproxy.io/owning-gateway-name=inference-gateway,gateway.envoyproxy.io/owning-gateway-namespace=$NAMESPACE" \
      -o jsonpath='{.items[0].metadata.name}')"
    [ -n "$name" ] || die "no Envoy Gateway Service for gateway inference-gateway"
    echo "envoy-gateway-system/$name"
    ;;
  esac
}

record_for_e2e() {
  # The e2e suite reads how to reach this gateway from here (e2e/cluster.py).
  local service routes=true
  service="$(gateway_service)"
  [ "$GATEWAY" != envoy ] || routes=false
  kubectl create configmap lora-epp-e2e -n "$NAMESPACE" \
    --from-literal=gateway="$GATEWAY" \
    --from-literal=service="$service" \
    --from-literal=port=80 \
    --from-literal=httpRoutes="$routes" \
    --dry-run=client -o yaml | kubectl apply -f -
}

smoke_test() {
  local service port_file pf_pid port="" status=""
  service="$(gateway_service)"
  port_file="$(mktemp)"
  say "sending one request through ${service}"
  kubectl port-forward -n "${service%%/*}" "svc/${service#*/}" :80 >"$port_file" 2>&1 &
  pf_pid=$!
  for _ in $(seq 1 50); do
    port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$port_file" | head -n 1)"
    [ -z "$port" ] || break
    sleep 0.2
  done
  if [ -n "$port" ]; then
    for _ in $(seq 1 30); do
      status="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
        -H 'content-type: application/json' \
        -d '{"model": "medical-lora", "prompt": "Hello", "max_tokens": 4}' || true)"
      [ "$status" != 200 ] || break
      sleep 2
    done
  fi
  kill "$pf_pid" 2>/dev/null || true
  wait "$pf_pid" 2>/dev/null || true
  rm -f "$port_file"
  [ "$status" = 200 ] || die "a request through the gateway did not succeed (last status: ${status:-none})"
}

main() {
  check_tools
  need curl "used for the final smoke test"
  create_cluster
  build_image
  install_crds
  install_gateway_controller
  deploy_stack
  wait_ready
  record_for_e2e
  smoke_test
  say "ready. Run the end-to-end suite with:  .venv/bin/pytest e2e"
}

main "$@"

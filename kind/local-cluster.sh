#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, without a container runtime: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (the node agent), built by
# kind/controlplane/install.sh.
#
#   kind/local-cluster.sh up DIR      # starts it, writes DIR/kubeconfig (cluster-admin)
#   kind/local-cluster.sh down DIR    # stops every process it started; DIR stays for its logs
#
# TLS everywhere (a CA of its own in DIR/pki), RBAC authorization, ServiceAccount tokens issued
# (the TokenRequest API; the controller manager's service-account controllers run). One node,
# `kwok-node-0`, is a kwok node: the scheduler places Pods on it, kwok marks them Running and Ready
# and gives each an IP from 127.1.0.0/16, on loopback, where a test can start what the Pod would
# run. No containers run and there is no CNI: nothing serves on a Pod IP unless something is
# started there. Logs in DIR/logs, ports in DIR/ports.env.
#
# Environment: CONTROLPLANE_BIN (default .controlplane/bin), POD_CIDR (127.1.0.0/16).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${CONTROLPLANE_BIN:-$ROOT/.controlplane/bin}"
POD_CIDR="${POD_CIDR:-127.1.0.0/16}"
SERVICE_CIDR="10.96.0.0/16"
NODE_NAME="kwok-node-0"
PROCESSES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

die() {
    echo "local-cluster.sh: $*" >&2
    exit 1
}
usage() { die "usage: $0 up DIR | down DIR"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# -- certificates ---------------------------------------------------------------------------------

cert() {  # name, subject, extensions (or ""): a key and a certificate signed by the cluster CA
    local name="$1" subject="$2" ext="$3" pki="$DIR/pki"
    openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
    openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
    local extfile="$pki/$name.ext"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" > "$extfile"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$extfile" -out "$pki/$name.crt" 2>/dev/null
}

make_pki() {
    local pki="$DIR/pki"
    mkdir -p "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
        -subj "/CN=lora-epp-local-ca" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    cert apiserver "/CN=kube-apiserver" \
        "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    cert admin "/O=system:masters/CN=local-admin" "extendedKeyUsage=clientAuth"
    cert controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
    cert scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
    # kwok stands in for the kubelet of every node it manages.
    cert kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth"
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

kubeconfig() {  # client cert name, output path
    local user="$1" out="$2" pki="$DIR/pki"
    cat > "$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $pki/$user.crt
    client-key: $pki/$user.key
contexts:
- name: local
  context: {cluster: local, user: $user}
current-context: local
EOF
}

# -- processes ------------------------------------------------------------------------------------

start() {  # name, command...: in the background, its pid in DIR/pids/NAME
    local name="$1"
    shift
    "$@" > "$DIR/logs/$name.log" 2>&1 &
    echo $! > "$DIR/pids/$name"
}

alive() { [ -f "$DIR/pids/$1" ] && kill -0 "$(cat "$DIR/pids/$1")" 2>/dev/null; }

wait_for() {  # what, seconds, command...
    local what="$1" seconds="$2"
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        for name in "${PROCESSES[@]}"; do
            if [ -f "$DIR/pids/$name" ] && ! alive "$name"; then
                tail -n 20 "$DIR/logs/$name.log" >&2
                stop_all
                die "$name exited while waiting for $what (log: $DIR/logs/$name.log)"
            fi
        done
        if [ $SECONDS -ge $deadline ]; then
            stop_all
            die "$what not ready within ${seconds}s (logs: $DIR/logs)"
        fi
        sleep 0.2
    done
}

api() {  # method, path, [body, [content type]]: the API as cluster-admin
    local pki="$DIR/pki"
    curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" -X "$1" \
        -H "Content-Type: ${4:-application/json}" ${3:+--data "$3"} "https://127.0.0.1:$APISERVER_PORT$2"
}

node_ready() {
    api GET "/api/v1/nodes/$NODE_NAME" | python3 -c '
import json, sys
conditions = json.load(sys.stdin)["status"].get("conditions", [])
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else 1)'
}

stop_all() {
    local name pid
    for ((i = ${#PROCESSES[@]} - 1; i >= 0; i--)); do
        name="${PROCESSES[$i]}"
        [ -f "$DIR/pids/$name" ] || continue
        pid="$(cat "$DIR/pids/$name")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$DIR/pids/$name"
    done
}

up() {
    for name in "${PROCESSES[@]}"; do
        [ -x "$BIN/$name" ] || die "$BIN/$name not found: build it with bash kind/controlplane/install.sh"
    done
    [ -s "$BIN/kwok-stages.yaml" ] || die "$BIN/kwok-stages.yaml not found: run bash kind/controlplane/install.sh"
    command -v openssl >/dev/null || die "openssl is needed for the cluster's certificates"
    command -v curl >/dev/null || die "curl is needed to wait for the API server"
    for name in "${PROCESSES[@]}"; do
        if alive "$name"; then die "$DIR already runs $name: run $0 down $DIR first"; fi
    done
    mkdir -p "$DIR/logs" "$DIR/pids"
    DIR="$(cd "$DIR" && pwd)"
    ETCD_PORT="$(free_port)"
    ETCD_PEER_PORT="$(free_port)"
    APISERVER_PORT="$(free_port)"
    cat > "$DIR/ports.env" <<EOF
ETCD_PORT=$ETCD_PORT
APISERVER_PORT=$APISERVER_PORT
EOF
    [ -f "$DIR/pki/ca.crt" ] || make_pki
    local pki="$DIR/pki"

    start etcd "$BIN/etcd" --name local --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" --log-level warn
    wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

    # Compaction is left to the tests (through etcd's API), so that a watch sees 410 Gone when
    # they say; the API server would otherwise compact every 5 minutes.
    start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --anonymous-auth=false \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --api-audiences https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
        --enable-admission-plugins PodNodeSelector \
        --etcd-compaction-interval 0 --endpoint-reconciler-type none
    wait_for kube-apiserver 90 api GET /readyz

    kubeconfig admin "$DIR/kubeconfig"
    kubeconfig controller-manager "$DIR/controller-manager.kubeconfig"
    kubeconfig scheduler "$DIR/scheduler.kubeconfig"
    kubeconfig kwok "$DIR/kwok.kubeconfig"

    start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
        --use-service-account-credentials --service-account-private-key-file "$pki/sa.key" \
        --root-ca-file "$pki/ca.crt" --cluster-signing-cert-file "$pki/ca.crt" \
        --cluster-signing-key-file "$pki/ca.key" --service-cluster-ip-range "$SERVICE_CIDR" \
        --controllers '*,-nodeipam,-nodelifecycle,-persistentvolume-binder,-attachdetach'
    start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/scheduler.kubeconfig" \
        --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
        --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
    start kwok "$BIN/kwok" --kubeconfig "$DIR/kwok.kubeconfig" --manage-all-nodes=false \
        --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --cidr "$POD_CIDR" \
        --node-ip 127.0.0.1 --server-address "127.0.0.1:0" --config "$BIN/kwok-stages.yaml"

    api POST /api/v1/nodes "{
      \"apiVersion\": \"v1\", \"kind\": \"Node\",
      \"metadata\": {\"name\": \"$NODE_NAME\", \"annotations\": {\"kwok.x-k8s.io/node\": \"fake\"},
                     \"labels\": {\"kubernetes.io/hostname\": \"$NODE_NAME\", \"type\": \"kwok\"}},
      \"status\": {\"allocatable\": {\"cpu\": \"64\", \"memory\": \"256Gi\", \"pods\": \"250\"},
                   \"capacity\": {\"cpu\": \"64\", \"memory\": \"256Gi\", \"pods\": \"250\"}}
    }" >/dev/null || { stop_all; die "could not create node $NODE_NAME"; }
    wait_for "node $NODE_NAME Ready" 60 node_ready
    # The API server taints a new node not-ready; the node lifecycle controller, which would lift
    # it, is off (it would also evict every Pod whenever a heartbeat came late on a busy machine).
    api PATCH "/api/v1/nodes/$NODE_NAME" '{"spec": {"taints": null}}' application/merge-patch+json \
        >/dev/null || { stop_all; die "could not lift the not-ready taint of $NODE_NAME"; }
    wait_for "the default ServiceAccount" 60 api GET /api/v1/namespaces/default/serviceaccounts/default
    echo "local-cluster.sh: up; KUBECONFIG=$DIR/kubeconfig (API server https://127.0.0.1:$APISERVER_PORT)"
}

[ $# -eq 2 ] || usage
DIR="$2"
case "$1" in
    up) up ;;
    down)
        [ -d "$DIR" ] || die "no cluster directory $DIR"
        stop_all
        echo "local-cluster.sh: down ($DIR kept: logs in $DIR/logs)"
        ;;
    *) usage ;;
esac

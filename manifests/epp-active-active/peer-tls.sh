#!/bin/sh
# Makes the peer exchange's mutual-TLS Secret for the active-active EPP of this overlay: a CA for
# the pool and one certificate, signed by it, that every replica presents. The certificate names
# vllm-llama3-8b.<namespace>.epp-peers, the name `epp serve` expects of its peers' certificates.
# Run it once per namespace, before (or after) `kubectl apply -k manifests/epp-active-active`:
#
#   sh manifests/epp-active-active/peer-tls.sh [NAMESPACE]          # creates or replaces the Secret
#   sh manifests/epp-active-active/peer-tls.sh [NAMESPACE] --print  # prints it (for GitOps) instead
#
# Needs openssl and kubectl (--print: kubectl only for rendering, no cluster). Replicas take up a
# replaced Secret within a minute or two (the kubelet's refresh, then their 30 s check); a new CA
# needs every replica to trust it before any presents a certificate from it. With cert-manager instead: a CA Issuer and a Certificate with that dnsName,
# usages "server auth" and "client auth", and secretName vllm-llama3-8b-epp-peer-tls
# (docs/cluster.md).
set -eu

NAMESPACE="${1:-default}"
MODE="${2:-apply}"
POOL=vllm-llama3-8b
SECRET="$POOL-epp-peer-tls"
IDENTITY="$POOL.$NAMESPACE.epp-peers"
DAYS="${PEER_TLS_DAYS:-3650}"

case "$MODE" in apply|--print) ;; *) echo "usage: $0 [NAMESPACE] [--print]" >&2; exit 2 ;; esac
for tool in openssl kubectl; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is needed" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$DAYS" -subj "/CN=$IDENTITY CA" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out ca.crt 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out tls.key
openssl req -new -key tls.key -subj "/CN=$IDENTITY" -out tls.csr
cat > leaf.ext <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$IDENTITY
EXT
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" -sha256 \
  -extfile leaf.ext -out tls.crt 2>/dev/null

kubectl create secret generic "$SECRET" --namespace "$NAMESPACE" --type kubernetes.io/tls \
  --from-file=ca.crt --from-file=tls.crt --from-file=tls.key --dry-run=client -o yaml > secret.yaml
if [ "$MODE" = "--print" ]; then
  cat secret.yaml
else
  kubectl apply -f secret.yaml
fi

"""What cluster DNS (CoreDNS's `kubernetes` plugin) answers, for the local control plane.

The local control plane has no DNS, yet what runs in a cluster finds Services by name: the plain
Envoy gateway (`manifests/gateway/envoy`) reaches the EPP replicas and the model-server pods
through headless Services (`STRICT_DNS` clusters on `NAME.NAMESPACE.svc.cluster.local`), and
learns that a replica or a pod came or went only from what those names resolve to. `ClusterDNS`
is a small DNS server on loopback that answers those names from the API server's own objects,
as CoreDNS does:

- a headless Service (`clusterIP: None`) resolves to the IPs of the Pods its selector matches that
  are Ready and not terminating (every one with an IP when it publishes not-ready addresses): the
  ready endpoints the EndpointSlice controller would publish. It cannot publish them here (the API
  server refuses EndpointSlice addresses in 127.0.0.0/8, and these Pod IPs are loopback ones), so
  they are computed from the Pods as that controller does;
- any other Service resolves to its cluster IP (which nothing routes here, as with no kube-proxy);
- a name that is no Service is NXDOMAIN; a Service name asked for another record type (AAAA)
  has no answer, so a resolver falls back to A.

Answers carry CoreDNS's default TTL (5 s). What is served is re-read from the API server every
`REFRESH_S`, so a change is visible within that plus the client's own refresh. Only UDP and only
`A` records: all that Envoy's resolver asks for these names.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import struct
import threading
from typing import Any

from kubernetes import client, config

from testkit.localcluster import LocalCluster

DOMAIN = "svc.cluster.local"
TTL_S = 5  # CoreDNS's kubernetes plugin default
REFRESH_S = 0.5

_TYPE_A = 1
_CLASS_IN = 1
_NXDOMAIN = 3
_FORMERR = 1


class ClusterDNS:
    """Serves `SERVICE.NAMESPACE.svc.cluster.local` on `address` while open (a background thread)."""

    def __init__(self, cluster: LocalCluster) -> None:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self._core = client.CoreV1Api(api)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self._records: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve, name="cluster-dns", daemon=True),
            threading.Thread(target=self._refresh_loop, name="cluster-dns-refresh", daemon=True),
        ]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()
        return str(host), int(port)

    def __enter__(self) -> ClusterDNS:
        self.refresh()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._socket.close()

    def resolve(self, name: str) -> list[str] | None:
        """The addresses `name` resolves to now; None when it names no Service (NXDOMAIN)."""
        with self._lock:
            return self._records.get(name.lower().rstrip("."))

    def refresh(self) -> None:
        """Read Services and Pods again (every `REFRESH_S` while open)."""
        services = _raw(
            self._core.list_service_for_all_namespaces(_preload_content=False, _request_timeout=5)
        )
        pods = _raw(self._core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=5))
        found = records(services["items"], pods["items"])
        with self._lock:
            self._records = found

    def _refresh_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            # An API hiccup: keep answering from what was read last, as CoreDNS does.
            with contextlib.suppress(Exception):
                self.refresh()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self._socket.recvfrom(512)
            except (TimeoutError, OSError):
                continue
            with contextlib.suppress(OSError):
                self._socket.sendto(self.answer(query), peer)

    def answer(self, query: bytes) -> bytes:
        """The response to one DNS query message."""
        try:
            ident, flags, name, qtype, question = _parse_query(query)
        except (ValueError, struct.error, IndexError):
            raw_id = query[:2].ljust(2, b"\0")
            return raw_id + struct.pack("!HHHHH", 0x8000 | _FORMERR, 0, 0, 0, 0)
        addresses = self.resolve(name)
        header_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080  # QR, opcode+RD copied, AA, RA
        if addresses is None:
            return struct.pack("!HHHHHH", ident, header_flags | _NXDOMAIN, 1, 0, 0, 0) + question
        answers = [a for a in addresses if qtype == _TYPE_A]
        body = b"".join(
            struct.pack("!HHHIH", 0xC00C, _TYPE_A, _CLASS_IN, TTL_S, 4) + socket.inet_aton(a) for a in answers
        )
        return struct.pack("!HHHHHH", ident, header_flags, 1, len(answers), 0, 0) + question + body


def records(services: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, list[str]]:
    """FQDN → addresses, from Services and Pods as the API serves them (JSON)."""
    out: dict[str, list[str]] = {}
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        name = f"{meta['name']}.{meta['namespace']}.{DOMAIN}"
        if spec.get("clusterIP") == "None":
            selector = spec.get("selector") or {}
            everyone = bool(spec.get("publishNotReadyAddresses"))
            out[name] = sorted(
                {
                    pod["status"]["podIP"]
                    for pod in pods
                    if selector
                    and pod["metadata"]["namespace"] == meta["namespace"]
                    and selector.items() <= (pod["metadata"].get("labels") or {}).items()
                    and (pod.get("status") or {}).get("podIP")
                    and (everyone or _ready(pod))
                },
                key=ipaddress.ip_address,
            )
        elif spec.get("clusterIP"):
            out[name] = [spec["clusterIP"]]
    return out


def _ready(pod: dict[str, Any]) -> bool:
    """Ready and not terminating: what the EndpointSlice controller publishes as ready."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _raw(response: Any) -> Any:
    """The JSON body of a call made with `_preload_content=False`."""
    return json.loads(response.data)


def _parse_query(message: bytes) -> tuple[int, int, str, int, bytes]:
    """(id, flags, name, qtype, the question section as sent)."""
    ident, flags, qdcount = struct.unpack("!HHH", message[:6])
    if qdcount != 1 or flags & 0x8000:
        raise ValueError("not a query with one question")
    labels, offset = [], 12
    while message[offset]:
        length = message[offset]
        if length & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(message[offset + 1 : offset + 1 + length].decode("ascii"))
        offset += 1 + length
    qtype, _qclass = struct.unpack("!HH", message[offset + 1 : offset + 5])
    return ident, flags, ".".join(labels), qtype, message[12 : offset + 5]

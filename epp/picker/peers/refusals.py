"""Who the peer exchange turned away, and why: a counter and a log line per refusal.

`inference_extension_peer_refused_total{reason}`, every reason present from the start (at 0) so
an alert on it needs no series to appear first. Log lines are capped per reason (the first, then
at most one every `LOG_EVERY_S` with the count since), so a scanner hammering the port cannot
flood the log; the counter counts every one.
"""

from __future__ import annotations

import enum
import logging

from prometheus_client import CollectorRegistry, Counter

from epp.clock import Clock

log = logging.getLogger(__name__)

METRIC = "inference_extension_peer_refused"  # exposed as ..._total
LOG_EVERY_S = 10.0


class Refusal(enum.Enum):
    """Why a peer connection or batch was refused (the metric's `reason` label)."""

    NO_CERTIFICATE = "no-certificate"  # TLS without a client certificate
    UNTRUSTED_CERTIFICATE = (
        "untrusted-certificate"  # not signed by the pool's CA: self-signed, another CA, expired
    )
    FOREIGN_IDENTITY = "foreign-identity"  # signed by the CA, but names another pool
    FOREIGN_POOL = "foreign-pool"  # a batch for another pool
    HANDSHAKE = "handshake"  # anything else before TLS was up: plaintext, a bad hello, a timeout


class PeerRefusals:
    def __init__(self, registry: CollectorRegistry | None, clock: Clock) -> None:
        self._counter = Counter(
            METRIC,
            "Peer-exchange connections and batches refused, by reason.",
            ("reason",),
            registry=registry,
        )
        self._children = {reason: self._counter.labels(reason.value) for reason in Refusal}
        self._clock = clock
        self._logged_at: dict[Refusal, float] = {}
        self._unlogged: dict[Refusal, int] = {}
        self.counts: dict[Refusal, int] = dict.fromkeys(Refusal, 0)

    def refuse(self, reason: Refusal, *, peer: str, detail: str) -> None:
        self._children[reason].inc()
        self.counts[reason] += 1
        now = self._clock.now()
        last = self._logged_at.get(reason)
        if last is not None and now - last < LOG_EVERY_S:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        self._logged_at[reason] = now
        log.warning(
            "peer refused",
            extra={
                "reason": reason.value,
                "peer": peer,
                "detail": detail,
                "not_logged_since_last": self._unlogged.pop(reason, 0),
            },
        )

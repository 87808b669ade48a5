"""Renewed peer certificates picked up without a restart.

The chart's Secret (or cert-manager's) is mounted as files that the kubelet rewrites when the
Secret changes. Every `interval_s` the three files are read again; when their bytes differ from
what is in use, they go through the same checks as at start-up (`load_peer_tls`) and, if they
pass, the peer port's handshakes and the sender's channels use them from then on. A renewal that
fails the checks (a key that does not match, a certificate for another pool, a half-written
Secret) is logged and counted, and the certificates in use stay: a bad renewal must not cut a
replica off from its peers.

`inference_extension_peer_tls_reloads_total{result}`: `applied` or `rejected`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter

from epp.clock import Clock
from epp.errors import ConfigError
from epp.picker.peers.credentials import PeerTls, load_peer_tls

log = logging.getLogger(__name__)

METRIC = "inference_extension_peer_tls_reloads"  # exposed as ..._total
DEFAULT_INTERVAL_S = 30.0  # well inside the kubelet's own delay in refreshing a mounted Secret


class Reload(enum.Enum):
    """What one look at the files found (the metric's `result` label for the last two)."""

    UNCHANGED = "unchanged"
    APPLIED = "applied"
    REJECTED = "rejected"


class PeerTlsRenewal:
    """Watches the `--peer-tls-*` files and hands renewed material to `apply`."""

    def __init__(
        self,
        tls: PeerTls,
        apply: Callable[[PeerTls], Awaitable[None]],
        *,
        clock: Clock,
        registry: CollectorRegistry | None,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._tls = tls
        self._apply = apply
        self._clock = clock
        self._interval_s = interval_s
        counter = Counter(
            METRIC, "Peer certificate renewals read from disk, by result.", ("result",), registry=registry
        )
        self._results = {result: counter.labels(result.value) for result in (Reload.APPLIED, Reload.REJECTED)}

    @property
    def current(self) -> PeerTls:
        return self._tls

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self._interval_s)
            await self.check()

    async def check(self) -> Reload:
        """Read the files once; apply them if they changed and pass the start-up checks."""
        files = self._tls.files
        try:
            on_disk = (files.ca.read_bytes(), files.cert.read_bytes(), files.key.read_bytes())
        except OSError as err:
            return self._reject(f"cannot read: {err}")
        if on_disk == (self._tls.ca_pem, self._tls.cert_pem, self._tls.key_pem):
            return Reload.UNCHANGED
        try:
            renewed = load_peer_tls(files, self._tls.identity)
        except ConfigError as err:
            return self._reject(str(err))
        await self._apply(renewed)
        self._tls = renewed
        self._results[Reload.APPLIED].inc()
        log.info("peer certificates renewed", extra={"cert": str(files.cert)})
        return Reload.APPLIED

    def _reject(self, reason: str) -> Reload:
        self._results[Reload.REJECTED].inc()
        log.error("renewed peer certificates rejected; keeping the ones in use", extra={"reason": reason})
        return Reload.REJECTED

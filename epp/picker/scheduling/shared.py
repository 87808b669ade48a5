"""Active-active EPP replicas that know each other's routing: the routing ledger, replicated.

Each replica of one pool schedules on its own state. Without help, a replica sees the other
replicas' requests only through the pods' scrapes: their in-flight requests as counts, up to
one scrape interval late, and the adapters they left idle in GPU slots not at all (vLLM's
metrics show only adapters with requests). So each replica believes there are free slots
that others have filled, sends new adapters there, and requests wait for slots. Measured in
`epp bench --epp-replicas 4` on zipf-100: P99 TTFT 2.6× one replica's.

`PeerReplicator` closes that gap with the smallest message that does: every flight our own
routing ledger records, (key, endpoint, adapter, age), and every one that finishes, its key.
Its peers record them in their own ledgers under the sender's id, exactly as their own routing
would: in flight on that endpoint, the adapter most recently used there, one more request for
the adapter's popularity (so every replica plans the same homes, and flow control counts the
same slots taken). Prompts are not shared; prefix-cache affinity stays per replica.

Per peer, outgoing events queue in an `_Outbox` until the transport sends them. A peer's
first batch, a peer that restarted (a new id in its reply) and a queue that overflowed get a
reset instead: our whole in-flight set, after which the peer drops what it held from us that
the reset leaves out (what it repeats still counts once).
A peer silent for `peer_timeout_s` (the transport sends a batch every interval, empty or
not) is forgotten with all its requests: a dead replica's requests stop counting, and a
partitioned one is re-learnt from its reset when it is heard again. Pure: no I/O, time
is the caller's `now`; the transport lives in `epp.picker.peers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.picker.scheduling.inflight import Flight
from epp.picker.scheduling.ledger import RoutingLedger


@dataclass(frozen=True, slots=True)
class PeerRouted:
    key: str  # the sender's request key
    endpoint: str
    adapter: str  # "" for the base model
    age_s: float  # how long before the batch was sent it was routed


@dataclass(frozen=True, slots=True)
class PeerBatch:
    sender: str
    reset: bool = False  # `routed` is the sender's whole in-flight set
    routed: tuple[PeerRouted, ...] = ()
    finished: tuple[str, ...] = ()


@dataclass(slots=True)
class _Outbox:
    """Events for one peer since its last batch; starts (and overflows into) a reset."""

    reset: bool = True
    routed: list[Flight] = field(default_factory=list)
    finished: dict[str, None] = field(default_factory=dict)  # keys, in order (a set that keeps it)
    receiver: str = ""  # the peer's process id, from its last reply


@dataclass(slots=True)
class _Peer:
    """What one sender put into our ledger, and when we last heard from it."""

    heard_at: float
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class PeerView:
    """One sender as `/debug/peers` shows it."""

    sender: str
    in_flight: int
    heard_s_ago: float


class PeerReplicator:
    """Sends our ledger's own flights to the peers and records theirs in it."""

    def __init__(
        self,
        ledger: RoutingLedger,
        *,
        own_id: str = "",
        peer_timeout_s: float = 5.0,
        max_queued: int = 50_000,
    ) -> None:
        if peer_timeout_s <= 0 or max_queued < 1:
            raise ValueError("peer_timeout_s must be positive, max_queued at least 1")
        self.ledger = ledger
        self.own_id = own_id  # this replica's id, as its batches name it
        self._peer_timeout_s = peer_timeout_s
        self._max_queued = max_queued
        self._outboxes: dict[str, _Outbox] = {}  # peer address -> its queue
        self._peers: dict[str, _Peer] = {}  # sender id -> what it put into our ledger
        ledger.listen(self._on_flight)

    # -- our own flights, as the ledger records them ----------------------------------------

    def _on_flight(self, flight: Flight, finished: bool, now: float) -> None:
        if flight.origin:  # a peer's: its sender tells the others itself
            peer = self._peers.get(flight.origin)
            if finished and peer is not None:  # e.g. our in-flight bounds let it go
                peer.keys.discard(flight.key)
            return
        for box in self._outboxes.values():
            if box.reset:
                continue
            if finished:
                box.finished[flight.key] = None
            else:
                # Routed again (a move): the peer's ledger moves it too, so the finish that came
                # first must not reach it; a batch applies its finishes after its routes.
                box.finished.pop(flight.key, None)
                box.routed.append(flight)
            if len(box.routed) + len(box.finished) > self._max_queued:
                box.reset = True
                box.routed, box.finished = [], {}

    # -- sending: one outbox per peer ------------------------------------------------------

    def set_peers(self, addresses: Sequence[str]) -> None:
        """The peers to send to now; a new one starts with a reset, a gone one is dropped."""
        wanted = set(addresses)
        for address in [a for a in self._outboxes if a not in wanted]:
            del self._outboxes[address]
        for address in addresses:
            self._outboxes.setdefault(address, _Outbox())

    def peers(self) -> list[str]:
        return list(self._outboxes)

    def drain(self, address: str, sender: str, now: float) -> PeerBatch:
        """The next batch for the peer at `address` (empty is a heartbeat); its queue restarts."""
        box = self._outboxes.setdefault(address, _Outbox())
        if box.reset:
            batch = PeerBatch(sender, True, tuple(_routed(f, now) for f in self.ledger.own()))
        else:
            batch = PeerBatch(sender, False, tuple(_routed(f, now) for f in box.routed), tuple(box.finished))
        box.reset = False
        box.routed = []
        box.finished = {}
        return batch

    def sent(self, address: str, receiver: str) -> None:
        """The peer at `address` took its batch and named itself `receiver`: a new name, a restart."""
        box = self._outboxes.get(address)
        if box is None:
            return
        if box.receiver and box.receiver != receiver:
            box.reset = True  # it lost what we told it: send everything again
            box.routed, box.finished = [], {}
        box.receiver = receiver

    def failed(self, address: str) -> None:
        """The batch for `address` was not delivered: the peer may have lost events; start over."""
        box = self._outboxes.get(address)
        if box is not None:
            box.reset = True
            box.routed, box.finished = [], {}

    # -- receiving: what the peers routed --------------------------------------------------

    def apply(self, batch: PeerBatch, now: float) -> None:
        """Record a peer's batch in our ledger, as if we had routed its requests ourselves.

        A reset finishes what we held from the sender and it no longer has; what it still has
        where we hold it stays as it is (it was routed once, and counts once).
        """
        ledger = self.ledger
        peer = self._peers.get(batch.sender)
        if peer is None:
            peer = self._peers[batch.sender] = _Peer(heard_at=now)
        peer.heard_at = now
        if batch.reset:
            still = {f"{batch.sender}/{routed.key}" for routed in batch.routed}
            for key in [k for k in peer.keys if k not in still]:
                peer.keys.discard(key)
                ledger.finished(key, now)
        for routed in batch.routed:
            key = f"{batch.sender}/{routed.key}"
            if batch.reset and key in peer.keys:
                held = ledger.inflight.get(key)
                if held is not None and (held.endpoint, held.adapter) == (routed.endpoint, routed.adapter):
                    continue
            at = now - max(0.0, routed.age_s)
            ledger.routed(key, routed.endpoint, routed.adapter, at, origin=batch.sender)
            peer.keys.add(key)
        for finished in batch.finished:
            key = f"{batch.sender}/{finished}"
            if key in peer.keys:
                peer.keys.discard(key)
                ledger.finished(key, now)

    def expire(self, now: float) -> list[str]:
        """Forget peers not heard from for `peer_timeout_s`, and their requests; returns their ids."""
        gone = [sender for sender, peer in self._peers.items() if now - peer.heard_at > self._peer_timeout_s]
        for sender in gone:
            self._drop(self._peers.pop(sender), now)
        return gone

    def peer_views(self, now: float) -> list[PeerView]:
        return [
            PeerView(sender, len(peer.keys), max(0.0, now - peer.heard_at))
            for sender, peer in sorted(self._peers.items())
        ]

    def _drop(self, peer: _Peer, now: float) -> None:
        for key in list(peer.keys):  # each finish also leaves `peer.keys`, through `_on_flight`
            self.ledger.finished(key, now)
        peer.keys.clear()


def _routed(flight: Flight, now: float) -> PeerRouted:
    return PeerRouted(flight.key, flight.endpoint, flight.adapter, max(0.0, now - flight.routed_at))

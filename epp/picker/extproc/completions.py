"""Requests whose ext_proc stream ended before their response did, finished by the gateway's access log.

The data plane sends the EPP only the request by default: the ext_proc stream ends once the
request is routed, so an EPP restart or crash cannot cut a response a model server is producing,
and the EPP's CPU per request does not grow with the response. What the EPP still needs after the
pick (that the request finished, which endpoint served it, its status and timing) comes from the
gateway's gRPC access log (`envoy.service.accesslog.v3.AccessLogService`), batched and off the
request path.

Each routed stream's request key (its life's key) travels to the data plane as dynamic metadata
beside the destination and comes back in the access-log entry. A stream that ends before its response waits
here for that entry, but only when the gateway it came from has an access-log stream open to this
EPP: a gateway that sends none has nothing to wait for, and its requests finish when their stream
ends. Waiting is bounded in time and count, and ends when that gateway's last log stream closes
(its entries would go elsewhere, if anywhere): what runs out is finished without an entry and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.clock import Clock
from epp.picker.lifecycle import Ending, RequestLife

DEFAULT_WAIT_S = 600.0
DEFAULT_MAX_WAITING = 100_000


@dataclass(frozen=True, slots=True)
class Completion:
    """How a request ended, as the data plane saw it."""

    status: int | None  # HTTP status sent to the client; None when none was (reset, client gone)
    served_address: str | None  # `ip:port` of the endpoint that answered (after retries)
    response_body_bytes: int = 0
    duration_s: float | None = None  # first request byte to last response byte, on the gateway's clock
    ttft_s: float | None = None  # first request byte to first byte from the endpoint


def peer_host(peer: str) -> str:
    """The host part of a grpc peer string: `ipv4:10.0.0.5:41234` → `10.0.0.5`, `ipv6:[::1]:5` → `::1`."""
    _, _, address = peer.partition(":")
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


class Completions:
    """Dispatched requests by key, and what finishes them from the access log. Lives on the event loop.

    A request's key is its life's key (`epp.picker.lifecycle`): unique to this process, so a
    restarted EPP (or another replica) ignores the entries of requests it did not route.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        if wait_s <= 0 or max_waiting <= 0:
            raise ValueError("wait_s and max_waiting must be positive")
        self._clock = clock
        self._wait_s = wait_s
        self._max_waiting = max_waiting
        self._open: set[str] = set()  # stream still open: it finishes itself, using an entry if one came
        self._logged: dict[str, Completion] = {}  # entries that came while their stream was open
        # Stream ended: key -> (deadline, gateway host, life), in the order the waits began.
        self._waiting: dict[str, tuple[float, str, RequestLife]] = {}
        self._log_streams: dict[str, int] = {}  # gateway host -> access-log streams open to us
        self.entries_matched = 0
        self.entries_unknown = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._open) + len(self._waiting)

    def expect(self, life: RequestLife) -> str:
        """`life` is being routed on an open stream; returns the key its access-log entry will carry."""
        self._open.add(life.key)
        return life.key

    def logged(self, key: str) -> Completion | None:
        """The entry that came for `key` while its stream was still open, if one did."""
        return self._logged.get(key)

    def receives_from(self, peer: str) -> bool:
        """Whether the gateway at `peer` (a grpc peer string) has an access-log stream open to us."""
        return self._log_streams.get(peer_host(peer), 0) > 0

    def wait(self, life: RequestLife, peer: str) -> None:
        """The stream of `life`, from the gateway at `peer`, ended before its response: wait (bounded)
        for its access-log entry."""
        key = life.key
        if key not in self._open:
            return
        self._open.discard(key)
        now = self._clock.now()
        self._expire(now)
        self._waiting[key] = (now + self._wait_s, peer_host(peer), life)

    def forget(self, key: str) -> None:
        """The request of `key` finished by itself (its response passed through, or no log will come)."""
        self._open.discard(key)
        self._logged.pop(key, None)
        self._waiting.pop(key, None)

    def finish(self, life: RequestLife, completion: Completion | None) -> None:
        """Finish `life` from its access-log entry (or, with None, as one that never came)."""
        self.forget(life.key)
        now = self._clock.now()
        if completion is None:
            self.expired += 1
            life.finish(Ending.EXPIRED, now)
            return
        outcome = life.outcome
        outcome.status = completion.status
        if completion.served_address:
            outcome.served_address = completion.served_address
        outcome.response_body_bytes = completion.response_body_bytes
        outcome.ttft_s = completion.ttft_s
        outcome.duration_s = completion.duration_s
        life.finish(Ending.ACCESS_LOG, now)

    def on_entry(self, key: str, completion: Completion) -> bool:
        """An access-log entry for `key`; False when the key is not ours or already finished."""
        waiting = self._waiting.get(key)
        if waiting is not None:
            self.entries_matched += 1
            self.finish(waiting[2], completion)
            return True
        if key in self._open:
            self.entries_matched += 1
            self._logged[key] = completion  # its stream is still open: it finishes with this
            return True
        self.entries_unknown += 1
        return False

    def log_stream_opened(self, peer: str) -> None:
        host = peer_host(peer)
        self._log_streams[host] = self._log_streams.get(host, 0) + 1

    def log_stream_closed(self, peer: str) -> None:
        host = peer_host(peer)
        left = self._log_streams.get(host, 0) - 1
        if left > 0:
            self._log_streams[host] = left
            return
        self._log_streams.pop(host, None)
        for key in [k for k, (_, h, _) in self._waiting.items() if h == host]:
            self.finish(self._waiting[key][2], None)

    def expire(self) -> None:
        """Finish, without an entry, every wait that has run out."""
        self._expire(self._clock.now())

    def _expire(self, now: float) -> None:
        waiting = self._waiting
        while waiting:
            _, (deadline, _, life) = next(iter(waiting.items()))
            if deadline > now and len(waiting) < self._max_waiting:
                break
            self.finish(life, None)

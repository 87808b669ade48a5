"""One request's life in the EPP, from its arrival to its one finish.

A `RequestLife` is minted when a request's ext_proc stream opens (or, in `epp bench`, when it
arrives) with a key unique to this process. That key is the request's identity everywhere: its
in-flight entry, its prefix-cache bookkeeping, the peer exchange, the decision log and the
completion key the gateway's access log sends back. The client's `x-request-id` is only shown,
never looked up: clients repeat it.

Stages go one way: ARRIVED → (QUEUED →) DISPATCHED → FINISHED, or straight to FINISHED when the
request is refused or its client leaves. `finish` is the only way to FINISHED and runs once,
whatever ends the request: its response passing through, the gateway's access-log entry, its
stream ending with no entry coming, an entry that never came, the client leaving while it waited,
or a refusal. The finisher the director installs at mint releases what the request held (its
queue place or its in-flight entry) and tells the observers.

A life holds what its finish needs (its request, decision and outcome), never its stream
handler or body: a request waiting in a queue costs the memory of its life and its queue entry.
"""

from __future__ import annotations

import enum
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from epp.errors import EppError
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.types import LLMRequest, SchedulingResult


class Stage(enum.Enum):
    ARRIVED = "arrived"  # minted; its body is being read or it is being admitted
    QUEUED = "queued"  # waiting in flow control for capacity
    DISPATCHED = "dispatched"  # routed to an endpoint (and counted in flight there)
    FINISHED = "finished"


class Ending(enum.Enum):
    """What ended a request."""

    RESPONSE = "response"  # its response passed through the stream to the end
    ACCESS_LOG = "access-log"  # the gateway's access-log entry
    STREAM_END = "stream-end"  # its stream ended and no access-log entry was coming
    EXPIRED = "expired"  # an access-log entry was expected and never came
    CLIENT_GONE = "client-gone"  # its client left before it was answered
    REFUSED = "refused"  # answered with an error (bad request, shed, queue full or timed out, no endpoint)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Where a request goes and what body it carries there."""

    endpoints: tuple[EndpointState, ...]  # primary first, then fallbacks
    request: LLMRequest
    result: SchedulingResult

    @property
    def destination(self) -> str:
        """The `x-gateway-destination-endpoint` value: a comma list without spaces."""
        return ",".join(state.address for state in self.endpoints)

    @property
    def primary(self) -> EndpointState:
        return self.endpoints[0]


@dataclass(slots=True)
class Outcome:
    """How the request ended, as the data plane told it (response, access log) or as the EPP answered."""

    status: int | None = None  # HTTP status to the client; None when none was sent
    served_address: str | None = None  # the endpoint that answered, when the data plane said
    streaming: bool = False  # an SSE response
    usage: Usage | None = None
    request_body_bytes: int = 0
    response_body_bytes: int = 0
    ttft_s: float | None = None  # to the first response byte, from arrival (or the gateway's clock)
    duration_s: float | None = None  # whole request, when the gateway measured it; None: until finish


Finisher = Callable[["RequestLife"], None]
Waiter = Callable[["RequestLife"], None]


@dataclass(eq=False, slots=True)
class RequestLife:
    """One request, from arrival to finish. Lives on the event loop (or the bench's loop)."""

    key: str  # unique in this process: the request's identity everywhere
    request_id: str  # the client's x-request-id (or the one we generated), for logs only
    arrived_at: float  # Clock time
    finisher: Finisher = field(repr=False)
    stage: Stage = Stage.ARRIVED
    request: LLMRequest | None = None  # once the body was read and the model resolved
    subset: tuple[str, ...] | None = None  # the data plane's subset hint, when it sent one
    fairness_id: str = ""  # its flow and band, once queued
    priority: int = 0
    decision: RoutingDecision | None = None  # once dispatched
    error: EppError | None = None  # the error it was answered with
    queued_at: float | None = None
    dispatched_at: float | None = None
    finished_at: float | None = None
    ending: Ending | None = None
    outcome: Outcome = field(default_factory=Outcome)
    # Called once when a queued request leaves its queue (dispatched, or refused with `error` set).
    waiter: Waiter | None = field(default=None, repr=False)
    # What observers noted on the way: headers the upstream request carries (e.g. `traceparent`),
    # whether the decision log has an entry for it, and the models it resolved to.
    upstream_headers: list[tuple[str, str]] = field(default_factory=list, repr=False)
    decision_logged: bool = False
    models: tuple[str, str] = ("", "")

    @property
    def finished(self) -> bool:
        return self.stage is Stage.FINISHED

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds spent queued in flow control; None when it never queued."""
        if self.queued_at is None:
            return None
        end = self.dispatched_at if self.dispatched_at is not None else self.finished_at
        return None if end is None else end - self.queued_at

    @property
    def upstream_ttft_s(self) -> float | None:
        """Seconds from its dispatch to the endpoint's first byte: the outcome's time to first byte
        less the time the request spent in the EPP before it (its queue wait included); None when
        the data plane did not say or it was never dispatched."""
        ttft = self.outcome.ttft_s
        if ttft is None or self.dispatched_at is None:
            return None
        return max(0.0, ttft - (self.dispatched_at - self.arrived_at))

    def refuse(self, error: EppError) -> None:
        """Record the error the request is answered with (the finish follows when it was sent)."""
        self.error = error
        self.outcome.status = error.http_status

    def finish(self, ending: Ending, now: float) -> bool:
        """End the request (once); False when it had already finished."""
        if self.ending is not None:  # finished, or finishing right now
            return False
        self.ending = ending
        self.finished_at = now
        self.finisher(self)  # reads the stage it ended in, then it is FINISHED
        self.stage = Stage.FINISHED
        return True


class KeyMint:
    """Keys unique to this process: a per-process prefix, so a restarted EPP (or another replica)
    never takes another's key for its own, and a sequence number."""

    def __init__(self, instance: str | None = None) -> None:
        self.prefix = f"{instance or secrets.token_hex(6)}-"
        self._sequence = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}{next(self._sequence)}"

"""The scheduling contract: the request the scheduler sees, its result, and the interface.

`scheduling/` is pure and synchronous: a request, candidate endpoints and a snapshot in,
an ordered list of endpoints out. No I/O, no `await`, time passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from epp.picker.datastore.types import Criticality, EndpointState, Snapshot
from epp.picker.scheduling.state import SchedulerState

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One inference request after model resolution, as the scheduler and admission see it."""

    request_id: str  # the request's key: unique in this process (see `epp.picker.lifecycle`)
    incoming_model: str  # body `model` as the client sent it ("" when there is no body)
    target_model: str  # after rewrite header / InferenceModel split: what the model server serves
    criticality: Criticality = Criticality.STANDARD
    priority: int = 0  # InferenceObjective priority; < 0 is sheddable
    objective: str | None = None
    prompt: str = ""  # text for prefix hashing: completions prompt or rendered chat messages
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False)
    body_size: int = 0
    arrival_s: float = 0.0  # Clock time the request arrived

    @property
    def sheddable(self) -> bool:
        return self.criticality is Criticality.SHEDDABLE or self.priority < 0


class NamedCandidates(list[EndpointState]):
    """Candidates that also answer "is this endpoint among them?" by name without a walk.

    Flow control's gate builds them from what it keeps per endpoint; a scheduler that samples a
    large pool checks its sample against `names` instead of indexing the whole list per decision.
    `names` may be a live view: read it during the decision the list was made for.
    """

    __slots__ = ("names",)

    def __init__(self, endpoints: Iterable[EndpointState], names: Container[str]) -> None:
        super().__init__(endpoints)
        self.names = names


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """Endpoints in preference order (primary first, then fallbacks), with the why."""

    endpoints: tuple[EndpointState, ...]
    profile: str = "default"
    reason: str = ""  # e.g. "adapter-active", "adapter-resident", "free-slot", "evict", "round-robin"
    # endpoint name -> scorer name -> score in [0, 1], for tracing and /debug/decisions
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    total_scores: Mapping[str, float] = field(default_factory=dict)
    planned_homes: tuple[str, ...] = ()  # endpoint names the placement plan gives the adapter, first first

    @property
    def primary(self) -> EndpointState:
        return self.endpoints[0]


class Scheduler(Protocol):
    """A routing policy: ours (`default`) or a baseline (`round-robin`, `gie-v1`, ...).

    `schedule` never returns an empty result: it raises `EppError(RESOURCE_EXHAUSTED)`
    when no candidate can serve. Candidates are never empty (the director answers 503 first).
    """

    name: str
    state: SchedulerState  # its routing ledger counts what the director routes and finishes

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult: ...

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        """The request was sent to `result.primary`: plugins that learn from picks (the prefix index)
        learn it. In-flight counts, residency and popularity are the ledger's (`state.ledger`)."""

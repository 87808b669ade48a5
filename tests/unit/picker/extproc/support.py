"""What the ext_proc tests share: a scheduler with a routing ledger, and an observer that records.

The scheduler picks like `tests.support.fake_scheduler.FakeScheduler` (candidates in name order) and
carries a real `SchedulerState`, so the director counts what it routes and finishes in the ledger
and flow control's gate reads the same counts. The observer keeps every life the director
reports, so a test asserts how each request ended (`life.ending`, `life.outcome`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import EndpointState, Snapshot
from epp.picker.lifecycle import RequestLife
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, SchedulingResult


def new_state() -> SchedulerState:
    return SchedulerState.create(seed=0, staleness_threshold_s=2.0)


@dataclass
class LedgerScheduler:
    """Picks candidates in name order (`max_endpoints` of them, primary first); records its calls."""

    max_endpoints: int = 1
    exhausted: bool = False
    name: str = "fake"
    state: SchedulerState = field(default_factory=new_state)
    scheduled: list[tuple[LLMRequest, tuple[str, ...]]] = field(default_factory=list)
    routed: list[tuple[str, str]] = field(default_factory=list)  # (request key, primary name)

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        self.scheduled.append((request, tuple(c.name for c in candidates)))
        if self.exhausted:
            raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "failed to find a target endpoint")
        chosen = sorted(candidates, key=lambda c: c.name)[: self.max_endpoints]
        return SchedulingResult(endpoints=tuple(chosen), reason="fake")

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        self.routed.append((request.request_id, result.primary.name))

    def in_flight(self) -> dict[str, str]:
        """Request key → endpoint, for every request the ledger counts in flight."""
        return {flight.key: flight.endpoint for flight in self.state.inflight}


class RecordingObserver:
    """A `DecisionObserver` that keeps what it is told: `events` in order as (what, request key,
    detail), the lives it heard finish, and the errors it heard requests refused with."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.finished_lives: list[RequestLife] = []
        self.refusals: list[tuple[EppError, str]] = []  # (error, outcome)

    def scheduled(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        result: SchedulingResult,
        duration_s: float,
    ) -> None:
        self.events.append(("scheduled", life.key, result.primary.name))

    def refused(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        error: EppError,
        *,
        outcome: str,
        duration_s: float,
    ) -> None:
        self.events.append(("refused", life.key, outcome))
        self.refusals.append((error, outcome))

    def queued(self, life: RequestLife) -> None:
        self.events.append(("queued", life.key, ""))

    def left_queue(self, life: RequestLife, outcome: str) -> None:
        self.events.append(("left_queue", life.key, outcome))

    def finished(self, life: RequestLife) -> None:
        self.events.append(("finished", life.key, life.ending.value if life.ending else ""))
        self.finished_lives.append(life)

    def kinds(self) -> list[str]:
        return [what for what, _, _ in self.events]

"""A bounded ring buffer of recent routing decisions, served as JSON on `GET /debug/decisions`.

Operators ask "why did this request go there?": each entry holds the candidates, the chosen
endpoints, the reason and every scorer's score, or the shed/error reason. Memory is bounded by
`capacity` entries (the oldest is dropped first); entries are frozen values, safe to hand out.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from aiohttp import web

DEFAULT_CAPACITY = 256
MAX_CAPACITY = 100_000  # the most `--decision-log-size` takes


@dataclass(frozen=True, slots=True)
class Decision:
    """One request's routing decision (or refusal)."""

    request_id: str  # the client's x-request-id (or the one generated for it)
    at_s: float  # Clock time of the decision
    model: str
    target_model: str
    criticality: str
    # "routed" | "shed" | "no-endpoint" | "queue-full" | "queue-EvictedTTL" | ... | "error"
    outcome: str
    candidates: tuple[str, ...] = ()
    chosen: tuple[str, ...] = ()  # endpoint addresses, primary first
    profile: str = ""
    reason: str = ""  # why the primary was picked, or why the request was refused
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    total_scores: Mapping[str, float] = field(default_factory=dict)
    planned_homes: tuple[str, ...] = ()  # the placement plan's homes for the adapter, first home first
    duration_s: float = 0.0
    error_code: str = ""
    response_status: int | None = None  # filled in when the request finishes
    key: str = ""  # the request's key in this EPP (its completion key, its in-flight entry)
    queue_wait_s: float | None = None  # seconds it waited in flow control; None: it never queued
    priority: int = 0  # its InferenceObjective's priority band (x-gateway-inference-objective); 0: none

    def to_json(self) -> dict[str, object]:
        entry = asdict(self)
        entry["scores"] = {name: dict(scores) for name, scores in self.scores.items()}
        entry["total_scores"] = dict(self.total_scores)
        return entry


@dataclass(slots=True)
class _Slot:
    """A held decision and the response status that arrived after it.

    Every request sets a status and few decisions are ever read, so the status is kept
    beside the frozen entry and merged into it only when read.
    """

    decision: Decision
    response_status: int | None = None

    def merged(self) -> Decision:
        if self.response_status == self.decision.response_status:
            return self.decision
        return replace(self.decision, response_status=self.response_status)


class DecisionLog:
    """The last `capacity` decisions, newest last. Lives on the event loop (not thread-safe).

    `capacity` is 1..MAX_CAPACITY, as `--decision-log-size` checks.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._entries: deque[_Slot] = deque(maxlen=capacity)

    @property
    def capacity(self) -> int:
        return self._entries.maxlen or 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, decision: Decision) -> None:
        self._entries.append(_Slot(decision, decision.response_status))

    def set_status(self, key: str, status: int | None) -> None:
        """Record the response status on the newest entry for the request `key`, if still held."""
        for slot in reversed(self._entries):
            if slot.decision.key == key:
                slot.response_status = status
                return

    def recent(self, limit: int | None = None) -> list[Decision]:
        """Newest first, at most `limit` entries."""
        slots = list(reversed(self._entries))
        if limit is not None:
            slots = slots[: max(0, limit)]
        return [slot.merged() for slot in slots]


def decisions_route(decisions: DecisionLog, *, path: str = "/debug/decisions") -> web.RouteDef:
    """`GET path[?limit=N]`: `{"capacity": C, "decisions": [...]}` newest first; a bad limit is a 400."""

    async def handler(request: web.Request) -> web.Response:
        raw = request.query.get("limit")
        limit: int | None = None
        if raw is not None:
            try:
                limit = int(raw)
            except ValueError:
                return web.json_response({"error": "limit must be an integer"}, status=400)
            if limit < 0:
                return web.json_response({"error": "limit must be >= 0"}, status=400)
        body = {
            "capacity": decisions.capacity,
            "decisions": [entry.to_json() for entry in decisions.recent(limit)],
        }
        return web.json_response(body, dumps=lambda obj: json.dumps(obj, default=str))

    return web.get(path, handler)

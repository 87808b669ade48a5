"""Which endpoints can start a request now: the gate between a queue and the scheduler.

`SaturationGate` is upstream's: while the pool is saturated (no endpoint has fresh metrics under
the queue-depth and KV thresholds) nothing is dispatched; otherwise every candidate is.

`SlotGate` is ours. A vLLM pod runs a batch of at most `max_lora` distinct adapters; a request
whose adapter is not in the batch while it holds `max_lora` others waits in the pod's queue for a
slot, whatever frees elsewhere. So per endpoint the gate counts two kinds of capacity:

- request headroom: its waiting queue (less requests deferred for a slot, counted below, plus the
  requests sent there since its scrape beyond what its batch had room for, less those we saw
  finish there since) and KV usage under the saturation thresholds (stale or missing metrics are
  not evidence: headroom). A pod may hold waiting what it finishes within `POD_WAIT_TARGET_S`,
  at most the detector's queue threshold; while the pool is overloaded (flow control refused a
  request it could not serve in time, within the last `OVERLOADED_HOLD_S`), none: a request goes
  to a pod only where its batch has room, so the EPP's order (priority band, then fairness)
  decides who starts next, not each pod's first-come order;
- adapter slots: the adapters with requests in flight there (ours from the routing ledger, plus
  any its scrape shows that we did not see finish since) against its `max_lora`.

A request can start on an endpoint with headroom where its adapter is in flight (it joins the
batch) or where a slot is free (it takes one). Base-model requests need no slot. vLLM reports
`max_lora` only once a pod has served a LoRA request (an idle engine writes no `lora_requests_info`),
so until then a pod counts as having the slots it last reported, or the residency model's default
(4): a fresh pod must not take every waiting adapter at once.

Starvation guard: slots normally free as adapters' last requests finish, and the queue hands
each freed slot on. When an adapter has waited `drain_after_s` for a slot and no slot has freed
among its candidates for that long either (every slot is held by adapters that never run dry),
the gate picks an endpoint with request headroom where some slot holder can be let go soonest
(the fewest requests in flight, the least popular on ties) and stops sending that holder's new
requests there; they go to
its other homes or wait. Its last request there finishes, and the slot frees for the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Protocol

from epp.picker.admission.saturation import SaturationDetector, SaturationLevel
from epp.picker.datastore.types import EndpointState, Metrics
from epp.picker.scheduling.framework import is_base_model
from epp.picker.scheduling.inflight import Flight
from epp.picker.scheduling.ledger import BASE_MODEL
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, NamedCandidates

# Requests a pod never yet seen with a full batch is assumed to start at once between two scrapes.
UNSEEN_BATCH_ROOM = 32
# While the pool is overloaded (flow control refused a request it could not serve in time), a pod
# takes a request only where its batch has room for it (no queue of its own), so the EPP's order
# (priority band, fairness) decides who starts next, not each pod's first-come order. The hold
# keeps that up this long after the last refusal. Otherwise a pod may queue the detector's
# threshold (5), which slot-bound traffic needs: `epp bench`, seed 1, zipf-100's P99 TTFT is 1.11 s
# with it and 1.58 s with no pod queue at all; priority-mix's goodput 56.8 % with a 5 s hold after
# any sign of saturation, 66.6 % with this one (docs/benchmarks.md, "Overload").
OVERLOADED_POD_QUEUE = 0
OVERLOADED_HOLD_S = 10.0
# Otherwise a pod seen with a full batch may hold what it finishes in this long at its recent pace
# (at most the detector's threshold): a queue on a pod is served in its order, not the EPP's, and
# on slow pods (a 70B batch of 64 finishes about 4 requests a second) the threshold's 5 wait over
# a second. A pod never seen full keeps the threshold: what waits there waits between two steps.
# `epp bench`, seed 1 (docs/benchmarks.md, "Overload"), with this and without: tenant-flood's
# steady tenants' P99 TTFT 347 ms and 1.28 s, priority-mix's Critical goodput 99.4 % and 80.7 %;
# zipf-100 and azure-conv the same to the digit.
POD_WAIT_TARGET_S = 0.25
# A queue standing this long beside the same batch, at the most a pod ever ran, says the batch is
# full (without it, tenant-flood's pods are first seen full once 5 wait on each: steady P99 454 ms
# instead of 347). Shorter, or counted while the batch grows, a long prefill step (2,000 tokens on
# a 70B pod) or a filling batch reads as full at a few requests: priority-mix's goodput fell from
# 66 % to 42-44 %.
BATCH_FULL_STANDING_S = 0.5


@dataclass(frozen=True, slots=True)
class EndpointRoom:
    """One endpoint's capacity as the gate sees it (for `/debug/flow-control`)."""

    endpoint: str
    headroom: bool  # its queue and KV are under the thresholds (or its metrics are not evidence)
    slots: int | None  # max_lora as scraped; None: not known, slots not gated
    in_flight: dict[str, int]  # adapter → requests in flight there ("" for the base model)
    free_slots: int | None
    draining: str | None = None  # the slot holder held back there, freeing a slot for a waiter


@dataclass(slots=True)
class _Room:
    """What `SlotGate` last worked out for one endpoint."""

    state: EndpointState
    headroom: bool
    free: int | None  # free LoRA slots; None: the endpoint reports none, so slots are not gated
    # Adapters its fresh scrape shows in the batch that our ledger does not hold there (another
    # replica's, or finished for us before the pod finished them): a request for one joins them.
    scheduled: frozenset[str] = frozenset()
    joins: frozenset[str] = frozenset()  # adapters a request can join it for now (headroom, not drained)
    batch: tuple[int, int] | None = None  # (free, all) batch slots; None: never seen full, or stale


@dataclass(frozen=True, slots=True)
class _Either:
    """A name in either set (the open endpoints, and those a request's adapter joins)."""

    first: Container[str]
    second: Container[str]

    def __contains__(self, name: object) -> bool:
        return name in self.first or name in self.second


class Gate(Protocol):
    def placeable(
        self, request: LLMRequest, candidates: Sequence[EndpointState], now: float
    ) -> Sequence[EndpointState]:
        """The candidates that can start `request` now (`candidates` itself when all can); empty: wait."""

    def blocked(
        self, request: LLMRequest, candidates: Sequence[EndpointState], since: float, now: float
    ) -> None:
        """`request` could not be placed and has waited since `since` (the starvation guard's cue)."""

    def rooms(self, endpoints: Sequence[EndpointState], now: float) -> list[EndpointRoom]:
        """Each endpoint's capacity, as this gate counts it."""

    def saturated(self, candidates: Sequence[EndpointState], now: float) -> bool:
        """No candidate has request headroom: the pool, not a LoRA slot, is what a request waits for."""

    def forget(self, alive: Container[str]) -> None:
        """Drop what the gate keeps of endpoints not in `alive` (they left the pool)."""

    def overloaded(self, now: float) -> None:
        """Flow control refused a request the pool could not serve in time: it is overloaded."""

    def is_overloaded(self, now: float) -> bool:
        """Whether the pool is held overloaded (a refusal within the hold)."""

    def batch_slots(self, candidates: Sequence[EndpointState], now: float) -> tuple[int, int] | None:
        """(free, all) batch slots over the candidates seen full, None where the gate cannot tell."""


class SaturationGate:
    """Upstream's gate: all candidates while the pool is not saturated, none while it is."""

    def __init__(self, detector: SaturationDetector) -> None:
        self._detector = detector

    def placeable(
        self, request: LLMRequest, candidates: Sequence[EndpointState], now: float
    ) -> Sequence[EndpointState]:
        if self._detector.level(candidates, now) is SaturationLevel.OK:
            return candidates
        return ()

    def blocked(
        self, request: LLMRequest, candidates: Sequence[EndpointState], since: float, now: float
    ) -> None:
        pass

    def rooms(self, endpoints: Sequence[EndpointState], now: float) -> list[EndpointRoom]:
        open_ = self._detector.level(endpoints, now) is SaturationLevel.OK
        return [EndpointRoom(e.endpoint.name, open_, None, {}, None) for e in endpoints]

    def saturated(self, candidates: Sequence[EndpointState], now: float) -> bool:
        return self._detector.level(candidates, now) is not SaturationLevel.OK

    def forget(self, alive: Container[str]) -> None:
        pass

    def overloaded(self, now: float) -> None:
        pass

    def is_overloaded(self, now: float) -> bool:
        return False

    def batch_slots(self, candidates: Sequence[EndpointState], now: float) -> tuple[int, int] | None:
        return None


class SlotGate:
    """Request headroom and LoRA slots per endpoint; see the module docstring."""

    def __init__(
        self,
        state: SchedulerState,
        detector: SaturationDetector,
        *,
        drain_after_s: float,
        overloaded_queue: int = OVERLOADED_POD_QUEUE,
        overloaded_hold_s: float = OVERLOADED_HOLD_S,
    ) -> None:
        self._state = state
        self._detector = detector
        self._drain_after_s = drain_after_s
        # (endpoint, adapter) -> when its last request there finished: a scrape older than that
        # showing the adapter active is not evidence that it still holds a slot.
        self._freed_at: dict[tuple[str, str], float] = {}
        self._last_finish: dict[str, float] = {}  # endpoint -> when any request finished there
        self._finishes: dict[str, deque[float]] = {}  # endpoint -> when requests finished there lately
        self._first_seen: dict[str, float] = {}  # endpoint -> when the gate first worked out its room
        self._overloaded_queue = overloaded_queue
        self._overloaded_hold_s = overloaded_hold_s
        self._tight_until = float("-inf")  # while now is before it, pods take no queue (see above)
        self._slot_freed_at: dict[str, float] = {}  # endpoint -> when an adapter last left it
        self._batch_size: dict[str, int] = {}  # endpoint -> its running requests when last seen full
        self._most_running: dict[str, int] = {}  # endpoint -> the most it was seen running
        # endpoint -> since when its scrapes show a queue beside the same batch, and that batch
        self._queue_since: dict[str, tuple[float, int]] = {}
        self._max_lora: dict[str, int] = {}  # endpoint -> the max_lora it last reported
        # endpoint -> (adapter held back there, the adapter it is freeing a slot for)
        self.draining: dict[str, tuple[str, str]] = {}
        # Every decision asks about every candidate, and between two of them only the endpoints a
        # request was routed to or finished on change (and, with a new snapshot, those scraped):
        # so each endpoint's room is kept, and only the restricted ones are looked at per request.
        self._rooms: dict[str, _Room] = {}
        self._restricted: set[str] = set()  # no headroom, no free slot, or a holder held back
        self._swept: Sequence[EndpointState] | None = None  # the candidates `_rooms` was built from
        self._valid_until = float("inf")  # when a restricting scrape turns stale (no evidence)
        self._dirty: set[str] = set()
        self._last_slot_freed = float("-inf")  # anywhere: a cheap first test for the starvation guard
        # Indexes over the rooms, so a request nothing can start is told so in O(1) (a backlog asks
        # once per waiting adapter at every pass): endpoints with request headroom, those with a
        # free slot too, and adapter → endpoints where it can join its batch.
        self._with_headroom: set[str] = set()
        self._open: set[str] = set()
        self._joinable: dict[str, set[str]] = {}
        self._sets_version = 0  # bumped when `_with_headroom` or `_open` changes
        self._lists: dict[tuple[int, int], Sequence[EndpointState]] = {}
        state.ledger.listen(self._on_flight)

    # -- the gate ---------------------------------------------------------------------------

    def placeable(
        self, request: LLMRequest, candidates: Sequence[EndpointState], now: float
    ) -> Sequence[EndpointState]:
        self._refresh(candidates, now)
        restricted = self._restricted
        if not restricted:
            return candidates
        base = is_base_model(request, self._state, candidates)
        adapter = BASE_MODEL if base else request.target_model
        if candidates is self._swept:  # the whole pool: the indexes answer most requests at once
            if base:
                return self._listed(self._with_headroom, candidates)
            joins = self._joinable.get(adapter)
            if not self._open and not joins:
                return ()
            held_back = any(drain[0] == adapter for drain in self.draining.values())
            if not held_back:
                # Where a slot is free, and where the adapter joins its batch: from the sets kept
                # per endpoint, not by walking the pool. The open part is the same list object
                # until an endpoint opens or fills.
                opened = self._listed(self._open, candidates)
                extra = joins - self._open if joins else None
                if not extra:
                    return opened
                rooms = self._rooms
                return NamedCandidates(
                    [*opened, *(rooms[name].state for name in sorted(extra))], _Either(self._open, extra)
                )
        rooms = self._rooms
        adapters_of = self._state.inflight.adapters
        keep: list[EndpointState] = []
        for e in candidates:
            name = e.endpoint.name
            if name not in restricted:
                keep.append(e)
                continue
            room = rooms[name]
            if not room.headroom:
                continue
            if adapter == BASE_MODEL or room.free is None:
                keep.append(e)
                continue
            holders = adapters_of(name)
            if (holders is not None and adapter in holders) or adapter in room.scheduled:
                drain = self.draining.get(name)
                if drain is None or drain[0] != adapter:
                    keep.append(e)
            elif room.free > 0:
                keep.append(e)
        return candidates if len(keep) == len(candidates) else keep

    def _listed(self, names: set[str], candidates: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """The candidates in `names` (the open or the with-headroom set), in candidate order,
        kept until either set changes (so `names` is what it was when the list was made)."""
        key = (id(names), self._sets_version)
        cached = self._lists.get(key)
        if cached is None:
            if len(names) == len(candidates):
                cached = candidates
            else:
                cached = NamedCandidates((e for e in candidates if e.endpoint.name in names), names)
            self._lists[key] = cached
        return cached

    def _refresh(self, candidates: Sequence[EndpointState], now: float) -> None:
        """Bring the kept rooms up to date: all of them for new candidates (a new snapshot) or once
        a restricting scrape turns stale, else those whose in-flight set or drain changed."""
        if candidates is not self._swept or now > self._valid_until:
            self._swept = candidates
            self._changed()
            self._rooms.clear()
            self._restricted.clear()
            self._with_headroom.clear()
            self._open.clear()
            self._joinable.clear()
            self._dirty.clear()
            self._valid_until = float("inf")
            for e in candidates:
                self._update(e, now)
            return
        if self._dirty:
            rooms = self._rooms
            for name in self._dirty:
                room = rooms.get(name)
                if room is not None:
                    self._update(room.state, now)
            self._dirty.clear()

    def _update(self, e: EndpointState, now: float) -> None:
        name = e.endpoint.name
        self._first_seen.setdefault(name, now)
        m = e.metrics
        headroom, batch = self._headroom(e, now)
        holders = self._state.inflight.adapters(name)
        scheduled = self._scheduled_elsewhere(name, holders, e, now)
        free: int | None = self._free_slots(name, self._slots(e), holders, e, now, len(scheduled))
        old = self._rooms.get(name)
        if old is not None:
            for adapter in old.joins:
                at = self._joinable.get(adapter)
                if at is not None:
                    at.discard(name)
                    if not at:
                        del self._joinable[adapter]
        joins: frozenset[str] = frozenset()
        was = (name in self._with_headroom, name in self._open)
        if headroom:
            drain = self.draining.get(name)
            joins = frozenset(holders or ()) | scheduled
            if drain is not None:
                joins -= {drain[0]}
            for adapter in joins:
                self._joinable.setdefault(adapter, set()).add(name)
            self._with_headroom.add(name)
        else:
            self._with_headroom.discard(name)
        if headroom and free is not None and free > 0:
            self._open.add(name)
        else:
            self._open.discard(name)
        if was != (name in self._with_headroom, name in self._open):
            self._changed()
        self._rooms[name] = _Room(e, headroom, free, scheduled, joins, batch)
        if not headroom or (free is not None and free <= 0) or name in self.draining:
            self._restricted.add(name)
            if m is not None:  # what its scrape says holds only while the scrape is fresh
                self._valid_until = min(
                    self._valid_until, m.updated_at + self._detector.staleness_threshold_s
                )
        else:
            self._restricted.discard(name)

    def blocked(
        self, request: LLMRequest, candidates: Sequence[EndpointState], since: float, now: float
    ) -> None:
        """Free a slot for an adapter that has waited `drain_after_s`, unless one is being freed for it."""
        adapter = request.target_model
        if now - since < self._drain_after_s or is_base_model(request, self._state, candidates):
            return
        if any(waiting == adapter for _, waiting in self.draining.values()):
            return
        if now - self._last_slot_freed < self._drain_after_s:
            return  # slots are turning over somewhere: the queue hands the next one on
        self._refresh(candidates, now)
        if candidates is self._swept:
            if not self._with_headroom:
                return  # every endpoint is short of request headroom, not of slots: draining frees nothing
        elif not any(self._rooms[e.endpoint.name].headroom for e in candidates):
            return
        freed = self._slot_freed_at
        last_freed = max(
            (freed.get(e.endpoint.name, float("-inf")) for e in candidates), default=float("-inf")
        )
        if now - last_freed < self._drain_after_s:
            return  # slots are turning over among its candidates: the queue hands the next one on
        target = self._drain_target(candidates, adapter, now)
        if target is not None:
            endpoint, holder = target
            self.draining[endpoint] = (holder, adapter)
            self._dirty.add(endpoint)

    def saturated(self, candidates: Sequence[EndpointState], now: float) -> bool:
        self._refresh(candidates, now)
        if candidates is self._swept:
            return not self._with_headroom
        return not any(self._rooms[e.endpoint.name].headroom for e in candidates)

    def overloaded(self, now: float) -> None:
        if self._overloaded_hold_s <= 0:
            return
        if now >= self._tight_until:
            self._swept = None  # every room is worked out again under the tighter target
        self._tight_until = now + self._overloaded_hold_s

    def is_overloaded(self, now: float) -> bool:
        return now < self._tight_until

    def batch_slots(self, candidates: Sequence[EndpointState], now: float) -> tuple[int, int] | None:
        """Over the candidates with fresh metrics seen with a full batch: the slots free now, as
        each room counted them (`_headroom`), and all their slots; None when none was seen full."""
        self._refresh(candidates, now)
        free = total = 0
        staleness = self._detector.staleness_threshold_s
        rooms = self._rooms
        for e in candidates:
            batch = rooms[e.endpoint.name].batch
            if batch is None or not e.is_fresh(now, staleness):
                continue
            free += batch[0]
            total += batch[1]
        return (free, total) if total else None

    def forget(self, alive: Container[str]) -> None:
        for per_endpoint in (
            self._last_finish,
            self._finishes,
            self._slot_freed_at,
            self._batch_size,
            self._max_lora,
            self._first_seen,
            self._most_running,
            self._queue_since,
        ):
            for name in [name for name in per_endpoint if name not in alive]:
                del per_endpoint[name]
        for key in [key for key in self._freed_at if key[0] not in alive]:
            del self._freed_at[key]
        for name in [name for name in self.draining if name not in alive]:
            del self.draining[name]
        if any(name not in alive for name in self._rooms):
            self._swept = None  # the next request rebuilds the rooms from its candidates

    def rooms(self, endpoints: Sequence[EndpointState], now: float) -> list[EndpointRoom]:
        """Each endpoint's capacity, worked out afresh without changing what the gate keeps: a
        view (`/debug/flow-control`, the pool page) must never move a decision."""
        rooms = []
        for e in endpoints:
            name = e.endpoint.name
            holders = self._state.inflight.adapters(name)
            slots = self._slots(e, record=False)
            scheduled = self._scheduled_elsewhere(name, holders, e, now)
            free = self._free_slots(name, slots, holders, e, now, len(scheduled))
            drain = self.draining.get(name)
            rooms.append(
                EndpointRoom(
                    endpoint=name,
                    headroom=self._headroom(e, now, record=False)[0],
                    slots=slots,
                    in_flight=dict(holders) if holders else {},
                    free_slots=max(0, free),
                    draining=drain[0] if drain is not None else None,
                )
            )
        return rooms

    # -- per endpoint -----------------------------------------------------------------------

    def _headroom(
        self, e: EndpointState, now: float, *, record: bool = True
    ) -> tuple[bool, tuple[int, int] | None]:
        """Its queue and KV under the thresholds; and, once its batch size is known, its (free,
        all) batch slots: its batch's room at the scrape, plus what finished there since, less
        what waits there and what was sent since.

        Requests sent since its scrape are not in it: those its batch had room for start at once,
        the rest wait there. Its batch's room is what it runs less its batch size, as last learned
        (`_learn_batch_size`); before that, `UNSEEN_BATCH_ROOM`. So a queue that just opened takes
        what the pod can start, not everything waiting here at once (the pod would serve a backlog
        in its own order, not by priority)."""
        m = e.metrics
        if m is None or not e.is_fresh(now, self._detector.staleness_threshold_s):
            return True, None  # missing or stale metrics are not evidence of a full pod
        name = e.endpoint.name
        queued = m.waiting_requests - m.deferred_requests
        if record:
            self._learn_batch_size(name, m, queued)
        full_at = self._batch_size.get(name)
        room = UNSEEN_BATCH_ROOM if full_at is None else max(0, full_at - m.running_requests)
        unseen = self._state.inflight.routed_from(name, m.updated_at)
        # What finished there since its scrape made room its scrape cannot show either.
        finished = self._finished_since(name, m.updated_at)
        allowed = self._pod_queue(name, now, record=record)
        # With no queue allowed, the request about to be sent must start at once: count it as sent
        # (else a pod whose one freed slot is taken by what waits there would take one more).
        sending = 1 if allowed == 0 else 0
        waiting = max(0, queued + max(0, unseen + sending - room) - finished)
        batch = None
        if full_at is not None:
            batch = (max(0, full_at - m.running_requests + finished - queued - unseen), full_at)
        return waiting <= allowed and m.kv_cache_usage <= self._detector.kv_cache_util_threshold, batch

    def _learn_batch_size(self, name: str, m: Metrics, queued: int) -> None:
        """How many requests its batch holds, from what its scrapes show (vLLM does not export
        `max_num_seqs`): a queue past the threshold (a few wait between two engine steps anyway),
        or one that has stood `BATCH_FULL_STANDING_S` while it ran the most it ever ran (a pod
        kept from queueing never shows the first; a long prefill step shows a short-lived queue)."""
        most = self._most_running.get(name, 0)
        running = m.running_requests
        if queued <= 0:
            self._queue_since.pop(name, None)
        else:
            since = self._queue_since.get(name)
            if since is None or since[1] != running:
                since = self._queue_since[name] = (m.updated_at, running)
            if running >= most and (
                queued > self._detector.queue_depth_threshold
                or m.updated_at - since[0] >= BATCH_FULL_STANDING_S
            ):
                self._batch_size[name] = running
        self._most_running[name] = max(most, running)

    def _pod_queue(self, name: str, now: float, *, record: bool = True) -> int:
        """The requests a pod may hold waiting: none while the pool is overloaded, else what it
        finishes within `POD_WAIT_TARGET_S` at its recent pace, at most the detector's threshold."""
        if now < self._tight_until:
            if record:  # the rooms are worked out again when the hold ends
                self._valid_until = min(self._valid_until, self._tight_until)
            return self._overloaded_queue
        threshold = self._detector.queue_depth_threshold
        if name not in self._batch_size:
            return threshold  # never seen full: what its scrape shows waiting is between two steps
        rate = self._finish_rate(name, now)
        if rate is None:
            return threshold
        return min(threshold, int(rate * POD_WAIT_TARGET_S))

    def _finish_rate(self, name: str, now: float) -> float | None:
        """Requests finished per second at `name` over the last staleness window; None until the
        gate has watched it that long."""
        first = self._first_seen.get(name)
        window = self._detector.staleness_threshold_s
        if first is None or now - first < window:
            return None
        return self._finished_since(name, now - window) / window

    def _finished_since(self, name: str, since: float) -> int:
        finishes = self._finishes.get(name)
        if not finishes:
            return 0
        n = 0
        for at in reversed(finishes):
            if at <= since:
                break
            n += 1
        return n

    def _changed(self) -> None:
        self._sets_version += 1
        self._lists.clear()

    def _slots(self, e: EndpointState, *, record: bool = True) -> int:
        """Its LoRA slots: as scraped, else as last scraped, else the residency model's default."""
        name = e.endpoint.name
        m = e.metrics
        if m is not None and m.max_lora > 0:
            if record:
                self._max_lora[name] = m.max_lora
            return m.max_lora
        return self._max_lora.get(name, self._state.residency.params.default_max_lora)

    def _scheduled_elsewhere(
        self, name: str, holders: dict[str, int] | None, e: EndpointState, now: float
    ) -> frozenset[str]:
        """Adapters `name`'s fresh scrape shows in its batch that our ledger does not hold there,
        unless we saw them finish there after that scrape."""
        m = e.metrics
        if m is None or not e.is_fresh(now, self._detector.staleness_threshold_s):
            return frozenset()  # a stale scrape is no evidence of what holds its slots now
        freed_at = self._freed_at
        return frozenset(
            active
            for active in m.active_adapters
            if active
            and (holders is None or active not in holders)
            and m.updated_at > freed_at.get((name, active), float("-inf"))
        )

    def _free_slots(
        self,
        name: str,
        slots: int,
        holders: dict[str, int] | None,
        e: EndpointState,
        now: float,
        scheduled_elsewhere: int,
    ) -> int:
        m = e.metrics
        held = 0 if holders is None else len(holders) - (BASE_MODEL in holders)
        fresh = m is not None and e.is_fresh(now, self._detector.staleness_threshold_s)
        if (
            fresh
            and m is not None
            and m.deferred_requests > 0
            and m.updated_at > self._last_finish.get(name, float("-inf"))
        ):
            return 0  # the pod has requests waiting for a slot, and nothing we know of freed one since
        return slots - held - scheduled_elsewhere

    def _drain_target(
        self, candidates: Sequence[EndpointState], adapter: str, now: float
    ) -> tuple[str, str] | None:
        """The (endpoint, slot holder) whose slot frees soonest at the least cost, or None."""
        inflight = self._state.inflight
        popularity = self._state.popularity
        best: tuple[int, float, str, str] | None = None
        rooms = self._rooms
        for e in candidates:
            name = e.endpoint.name
            if name in self.draining:
                continue
            room = rooms.get(name)
            if room is not None and not room.headroom:
                continue  # draining a pod that cannot start the waiter anyway frees nothing for it
            holders = inflight.adapters(name)
            if not holders:
                continue
            for holder, count in holders.items():
                if holder in (BASE_MODEL, adapter):
                    continue
                key = (count, popularity.rate(holder, now), name, holder)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[2], best[3])

    def _on_flight(self, flight: Flight, finished: bool, now: float) -> None:
        endpoint, adapter = flight.endpoint, flight.adapter
        self._dirty.add(endpoint)
        if not finished:
            return
        self._last_finish[endpoint] = now
        finishes = self._finishes.setdefault(endpoint, deque())
        finishes.append(now)
        horizon = now - self._detector.staleness_threshold_s  # older finishes precede any fresh scrape
        while finishes[0] < horizon:
            finishes.popleft()
        if self._state.inflight.adapter_count(endpoint, adapter) == 0:
            self._freed_at[(endpoint, adapter)] = now
            if adapter != BASE_MODEL:
                self._slot_freed_at[endpoint] = now
                self._last_slot_freed = now
            drain = self.draining.get(endpoint)
            if drain is not None and drain[0] == adapter:
                del self.draining[endpoint]

"""One request, from headers and body to a routing decision.

The director is synchronous and does no I/O: it resolves the model, builds the `LLMRequest`,
narrows candidates by the subset hint, runs admission and the scheduler, and hands back the
endpoints and the (possibly rewritten) body. Every failure is an `EppError` for `extproc`.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker import wire
from epp.picker.context import RequestContext
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Criticality, EndpointState, InferenceModel, Snapshot
from epp.picker.scheduling.types import LLMRequest, Scheduler, SchedulingResult

log = logging.getLogger(__name__)

# admit(request, candidates, snapshot, now) raises EppError(RESOURCE_EXHAUSTED) to shed.
AdmitFn = Callable[[LLMRequest, Sequence[EndpointState], Snapshot, float], None]


def admit_all(
    request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
) -> None:
    """Admission that never sheds (used when no admission policy is configured)."""


@dataclass(frozen=True, slots=True)
class SubsetHint:
    """The data plane's `envoy.lb.subset_hint` list: `ip:port` entries match exactly, bare IPs by IP."""

    addresses: frozenset[str]
    ips: frozenset[str]

    @classmethod
    def parse(cls, entries: Sequence[str]) -> SubsetHint:
        addresses: set[str] = set()
        ips: set[str] = set()
        for entry in entries:
            for item in entry.split(","):
                item = item.strip()
                if not item:
                    continue
                if _has_port(item):
                    addresses.add(item)
                else:
                    ips.add(item.strip("[]"))
        return cls(frozenset(addresses), frozenset(ips))

    def allows(self, state: EndpointState) -> bool:
        return state.address in self.addresses or state.endpoint.ip in self.ips


def _has_port(item: str) -> bool:
    if item.startswith("["):
        return "]:" in item
    return item.count(":") == 1


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Where a request goes and what body it carries there."""

    endpoints: tuple[EndpointState, ...]  # primary first, then fallbacks
    body: bytes  # the original bytes unless the model was rewritten
    request: LLMRequest
    result: SchedulingResult

    @property
    def destination(self) -> str:
        """The `x-gateway-destination-endpoint` value: a comma list without spaces."""
        return ",".join(state.address for state in self.endpoints)

    @property
    def primary(self) -> EndpointState:
        return self.endpoints[0]


class Director:
    """Routes one request at a time against one datastore snapshot."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        *,
        admit: AdmitFn = admit_all,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> None:
        self._datastore = datastore
        self._scheduler = scheduler
        self._admit = admit
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    def route(
        self,
        *,
        request_id: str,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: Sequence[str] | None = None,
        arrival_s: float | None = None,
        context: RequestContext | None = None,
    ) -> RoutingDecision:
        """Pick endpoints for a request; `body=None` means a request without a body (e.g. GET).

        `headers` are lower-cased. `subset` is the subset hint list, None when the data plane sent none.
        `context` travels with the request to the observers (a fresh one when None).
        """
        now = self._clock.now()
        snapshot = self._datastore.snapshot()
        payload = parse_body(body) if body is not None else None
        request, new_body = self._build_request(
            request_id=request_id,
            headers=headers,
            body=body,
            payload=payload,
            snapshot=snapshot,
            arrival_s=now if arrival_s is None else arrival_s,
            context=context if context is not None else RequestContext(),
        )
        candidates = select_candidates(snapshot, subset)
        self._admit(request, candidates, snapshot, now)
        result = self._scheduler.schedule(request, candidates, snapshot, now)
        if not result.endpoints:
            raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "failed to find a target endpoint", reason="no-pick")
        self._scheduler.on_routed(request, result, now)
        return RoutingDecision(endpoints=result.endpoints, body=new_body, request=request, result=result)

    def complete(self, decision: RoutingDecision, *, served_address: str | None, status: int) -> None:
        """The response ended: tell the scheduler which endpoint served it and whether it went well."""
        endpoint_name = decision.primary.name
        if served_address:
            for state in decision.endpoints:
                if state.address == served_address:
                    endpoint_name = state.name
                    break
            else:
                found = _endpoint_by_address(self._datastore.snapshot(), served_address)
                if found is not None:
                    endpoint_name = found.name
        self._scheduler.on_completed(decision.request, endpoint_name, self._clock.now())

    def _build_request(
        self,
        *,
        request_id: str,
        headers: Mapping[str, str],
        body: bytes | None,
        payload: dict[str, Any] | None,
        snapshot: Snapshot,
        arrival_s: float,
        context: RequestContext,
    ) -> tuple[LLMRequest, bytes]:
        objective = headers.get(wire.OBJECTIVE_HEADER) or None
        priority = 0
        if objective is not None and objective in snapshot.objectives:
            priority = snapshot.objectives[objective].priority
        if payload is None:
            request = LLMRequest(
                request_id=request_id,
                incoming_model="",
                target_model="",
                priority=priority,
                objective=objective,
                headers=headers,
                arrival_s=arrival_s,
                context=context,
            )
            return request, b""
        assert body is not None
        incoming = payload.get("model")
        if not isinstance(incoming, str):
            raise EppError(ErrorCode.BAD_REQUEST, "model not found in request body", reason="no-model")
        criticality = Criticality.STANDARD
        rewrite = headers.get(wire.MODEL_NAME_REWRITE_HEADER)
        if rewrite:
            target = rewrite
            model = snapshot.models.get(incoming)
            if model is not None and model.criticality is not None:
                criticality = model.criticality
        elif snapshot.has_model_registry:
            model = snapshot.models.get(incoming)
            if model is None:
                raise EppError(
                    ErrorCode.NOT_FOUND,
                    f"error finding a model object in InferenceModel for input model {incoming}",
                    reason="unknown-model",
                )
            target = self._draw_target(model)
            criticality = model.criticality or Criticality.STANDARD
        else:
            target = incoming
        new_body = body
        if target != incoming:
            payload["model"] = target
            new_body = replace_top_level_string(body, "model", target)
        request = LLMRequest(
            request_id=request_id,
            incoming_model=incoming,
            target_model=target,
            criticality=criticality,
            priority=priority,
            objective=objective,
            prompt=prompt_text(payload),
            headers=headers,
            body_size=len(new_body),
            arrival_s=arrival_s,
            context=context,
        )
        return request, new_body

    def _draw_target(self, model: InferenceModel) -> str:
        """Weighted draw over the InferenceModel's targets; no weights → uniform; no targets → modelName."""
        targets = model.target_models
        if not targets:
            return model.model_name
        weights = [t.weight for t in targets]
        if all(w is None for w in weights):
            return self._rng.choice(targets).name
        numeric = [w or 0 for w in weights]
        if sum(numeric) <= 0:
            return self._rng.choice(targets).name
        return self._rng.choices(targets, weights=numeric, k=1)[0].name


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting too deep
        raise EppError(ErrorCode.BAD_REQUEST, "Error unmarshaling request body", reason="bad-json") from err
    if not isinstance(payload, dict):
        raise EppError(ErrorCode.BAD_REQUEST, "Error unmarshaling request body", reason="bad-json")
    return payload


_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def replace_top_level_string(body: bytes, key: str, value: str) -> bytes:
    """`body` with only the top-level `key`'s value replaced, every other byte kept.

    Clients' number formats, spacing and key order survive a model rewrite. The body was
    already parsed as a JSON object; the last occurrence of `key` is the one that counts.
    """
    text = body.decode("utf-8")
    span: tuple[int, int] | None = None
    index = _skip(text, 0)
    if text[index] != "{":  # pragma: no cover - parse_body accepted only objects
        raise ValueError("not a JSON object")
    index = _skip(text, index + 1)
    while index < len(text) and text[index] != "}":
        name, index = _DECODER.raw_decode(text, index)
        index = _skip(text, _skip(text, index) + 1)  # past ':'
        _, end = _DECODER.raw_decode(text, index)
        if name == key:
            span = (index, end)
        index = _skip(text, end)
        if text[index] == ",":
            index = _skip(text, index + 1)
    if span is None:  # pragma: no cover - the caller read `key` from this body
        raise ValueError(f"no top-level {key!r}")
    replacement = json.dumps(value, ensure_ascii=False)
    return (text[: span[0]] + replacement + text[span[1] :]).encode("utf-8")


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def prompt_text(payload: Mapping[str, Any]) -> str:
    """Text for prefix hashing: completions `prompt`, or chat `messages` in ChatML form."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            role_text = role if isinstance(role, str) else ""
            content = _content_text(message.get("content"))
            parts.append(f"<|im_start|>{role_text}\n{content}<|im_end|>\n")
        return "".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "".join(texts)
    return ""


def select_candidates(snapshot: Snapshot, subset: Sequence[str] | None) -> tuple[EndpointState, ...]:
    """Ready endpoints ∩ subset hint; none → 503 (never pick outside the hint)."""
    candidates = snapshot.endpoints
    if subset is not None:
        hint = SubsetHint.parse(subset)
        candidates = tuple(state for state in candidates if hint.allows(state))
    if not candidates:
        raise EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "failed to find candidate pods for serving the request",
            reason="no-endpoints",
        )
    return candidates


def _endpoint_by_address(snapshot: Snapshot, address: str) -> EndpointState | None:
    for state in snapshot.endpoints:
        if state.address == address:
            return state
    return None

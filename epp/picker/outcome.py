"""What happened to one request, as its ext_proc stream saw it: the record observers take."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from epp.errors import EppError
from epp.picker.context import RequestContext
from epp.picker.director import RoutingDecision


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class FinishedBy(enum.Enum):
    """What told the EPP that a routed request had finished."""

    RESPONSE = "response"  # its response passed through the stream to the end
    ACCESS_LOG = "access-log"  # the gateway's access-log entry
    STREAM_END = "stream-end"  # its stream ended and no access-log entry was coming
    EXPIRED = "expired"  # an access-log entry was expected and never came


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """What happened on one stream, handed to `on_finished` (metrics, decision log)."""

    request_id: str
    decision: RoutingDecision | None
    error: EppError | None
    response_status: int | None
    streaming_response: bool
    usage: Usage | None
    request_body_bytes: int
    response_body_bytes: int
    ttft_s: float | None = None  # to the first response byte, from arrival (or the gateway's clock)
    duration_s: float | None = None  # whole request, when the gateway measured it; None: until now
    finished_by: FinishedBy | None = None  # None: the request was never routed
    served_address: str | None = None  # the endpoint that answered, when the data plane said
    context: RequestContext = field(default_factory=RequestContext)  # what observers noted on the way

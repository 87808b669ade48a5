"""One request's scratch space, from its ext_proc stream's first message to its record.

Observers note here what they decide while the request is routed (that its decision was
logged, the models it resolved to, the trace headers the upstream request carries), and the
stream reads it back. One per stream, passed along with the request: client-chosen request ids
may repeat, so nothing is looked up by id.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestContext:
    upstream_headers: list[tuple[str, str]] = field(default_factory=list)  # e.g. `traceparent`
    decision_logged: bool = False  # admission or the scheduler saw it (and the decision log has it)
    models: tuple[str, str] = ("", "")  # (model_name, target_model_name) once the body was read

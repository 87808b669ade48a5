"""One error type for everything a request can fail with, and its mapping to HTTP.

Only `epp.picker.extproc` turns an `EppError` into an Envoy ImmediateResponse; every other
layer raises it and lets it travel up.
"""

from __future__ import annotations

import enum
import json


class ErrorCode(enum.Enum):
    """Upstream error codes (the `type` in the error body) and the HTTP status each maps to."""

    BAD_REQUEST = ("BadRequest", 400)
    NOT_FOUND = ("NotFound", 404)
    RESOURCE_EXHAUSTED = ("InferencePoolResourceExhausted", 429)
    INTERNAL = ("Internal", 500)
    SERVICE_UNAVAILABLE = ("ServiceUnavailable", 503)

    def __init__(self, wire_name: str, http_status: int) -> None:
        self.wire_name = wire_name
        self.http_status = http_status


class EppError(Exception):
    """A request-level failure with a code the client sees as an HTTP status."""

    def __init__(
        self, code: ErrorCode, message: str, *, reason: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # A short machine-readable reason (e.g. "saturated", "no-endpoints") for metrics and logs.
        self.reason = reason
        # When the client may try again (the `retry-after` header of a 429); None: the default.
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        return self.code.http_status

    def text(self) -> str:
        """The upstream message text, kept so operators' log searches still match."""
        return f"inference gateway: {self.code.wire_name} - {self.message}"

    def body(self) -> bytes:
        """OpenAI-style JSON error body, which client SDKs parse."""
        payload = {
            "error": {
                "message": self.text(),
                "type": self.code.wire_name,
                "code": self.code.http_status,
            }
        }
        return json.dumps(payload, separators=(",", ":")).encode()

    def __repr__(self) -> str:
        return f"EppError({self.code.name}, {self.message!r})"


class ConfigError(Exception):
    """Bad configuration or a bad object (flags, pool file, picker config): a clear message for the user.

    At start-up it stops the process with the message; on a reload it is logged and the
    last good state is kept.
    """

"""Logging setup: JSON lines (or text), a request id on every line, `--v` verbosity levels.

`--v` follows upstream: 2 is the default (info), 3 verbose, 4 debug, 5 trace. Library code
only calls `logging.getLogger(__name__)` with constant messages and fields in `extra`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

TRACE = 5
VERBOSE = 15  # --v=3: between DEBUG and INFO
logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(VERBOSE, "VERBOSE")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else came from `extra` and is written as a field.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def level_for_verbosity(verbosity: int) -> int:
    """Map `--v` to a logging level: ≤1 warning, 2 info, 3 verbose, 4 debug, ≥5 trace."""
    if verbosity <= 1:
        return logging.WARNING
    if verbosity == 2:
        return logging.INFO
    if verbosity == 3:
        return VERBOSE
    if verbosity == 4:
        return logging.DEBUG
    return TRACE


@contextmanager
def bound_request_id(request_id: str) -> Iterator[None]:
    """Put `request_id` on every log line written inside the block."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` from the contextvar to each record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k != "request_id"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id when set, then the `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Human-readable lines with the `extra` fields as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            fields = {"request_id": request_id, **fields}
        suffix = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{self.formatTime(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if suffix:
            line = f"{line} {suffix}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure_logging(*, verbosity: int = 2, log_format: str = "json", stream: TextIO | None = None) -> None:
    """Replace the root handlers with one stderr handler in the chosen format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_for_verbosity(verbosity))
    # Third-party chatter stays at warning unless tracing.
    if verbosity < 5:
        for name in ("aiohttp.access", "kubernetes", "urllib3", "grpc"):
            logging.getLogger(name).setLevel(logging.WARNING)

"""JSON-lines logging, the request-id contextvar and `--v` levels."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from epp.picker.logs import (
    TRACE,
    VERBOSE,
    bound_request_id,
    configure_logging,
    level_for_verbosity,
)


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging(verbosity=4, log_format="json", stream=stream)
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved_handlers:
        root.addHandler(handler)
    root.setLevel(saved_level)


@pytest.mark.parametrize(
    ("verbosity", "level"),
    [(0, logging.WARNING), (2, logging.INFO), (3, VERBOSE), (4, logging.DEBUG), (5, TRACE), (9, TRACE)],
    ids=["quiet", "default", "verbose", "debug", "trace", "beyond"],
)
def test_verbosity_levels(verbosity: int, level: int) -> None:
    assert level_for_verbosity(verbosity) == level


def test_json_lines_carry_fields_and_request_id(captured: io.StringIO) -> None:
    log = logging.getLogger("epp.test")
    with bound_request_id("req-9"):
        log.info("request routed", extra={"destination": "10.0.0.1:8000"})
    log.debug("outside")
    log.log(TRACE, "too detailed")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [(e["msg"], e.get("request_id")) for e in lines] == [
        ("request routed", "req-9"),
        ("outside", None),
    ]
    assert lines[0]["destination"] == "10.0.0.1:8000"
    assert lines[0]["level"] == "info" and lines[0]["logger"] == "epp.test"


def test_text_format(captured: io.StringIO) -> None:
    stream = io.StringIO()
    configure_logging(verbosity=2, log_format="text", stream=stream)
    logging.getLogger("epp.test").warning("pool changed", extra={"pods": 3})
    line = stream.getvalue().strip()
    assert "WARNING" in line and "epp.test: pool changed" in line and line.endswith("pods=3")

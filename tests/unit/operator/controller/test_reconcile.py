"""`contains`: what the reconciler treats as "already as desired" (server defaults ignored)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.operator.controller.reconcile import contains


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        ({"a": 1, "server-default": 2}, {"a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({}, {"a": 1}, False),
        ({"ports": [{"port": 80, "protocol": "TCP"}]}, {"ports": [{"port": 80}]}, True),
        ({"args": ["--a", "--b"]}, {"args": ["--a"]}, False),
        ({"args": ["--b", "--a"]}, {"args": ["--a", "--b"]}, False),
        ({"x": {"y": {"z": 1, "w": 2}}}, {"x": {"y": {"z": 1}}}, True),
        ({"x": "1"}, {"x": 1}, False),
        ({"x": [1]}, {"x": {}}, False),
        ({"spec": {}}, {"spec": {"volumes": [], "labels": {}}}, True),
        ({"spec": {}}, {"spec": {"volumes": [{"name": "v"}]}}, False),
    ],
    ids=[
        "extra-keys",
        "changed-value",
        "missing-key",
        "list-items-with-defaults",
        "list-shorter",
        "list-order",
        "nested",
        "type-differs",
        "shape-differs",
        "empty-omitted-by-the-server",
        "non-empty-missing",
    ],
)
def test_contains(current: Any, desired: Any, expected: bool) -> None:
    assert contains(current, desired) is expected

"""The end-to-end checks of e2e/checks.py against a stack on loopback: real Envoy, `epp serve`
and `epp sim` pods (e2e/local.py). The same functions run against a cluster with `pytest e2e`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from e2e.checks import CHECKS
from e2e.local import LocalE2EStack
from e2e.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def local_stack() -> Iterator[LocalE2EStack]:
    stack = LocalE2EStack()
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))
def test_check(local_stack: LocalE2EStack, check: Callable[[Stack], None]) -> None:
    check(local_stack)

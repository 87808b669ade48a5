"""Every check of e2e/checks.py against the cluster (see conftest.py for how it is found).

Order matters a little: the disruptive checks (EPP stopped, pod deleted, leader killed) run
after the ones that measure routing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.checks import CHECKS
from e2e.cluster import ClusterStack
from e2e.stack import Stack

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))
def test_check(cluster_stack: ClusterStack, check: Callable[[Stack], None]) -> None:
    check(cluster_stack)

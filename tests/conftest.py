"""Suite-wide: the fake Kubernetes API plugin, and how pytest-xdist shares the tests out.

The README's test command runs on every core (`-n auto` in pyproject.toml). Most integration
tests wait on their processes rather than compute, so two workers on two cores finish the suite
in far less time than one. A test module is one unit of work, so a stack a module shares (a
module-scoped fixture) starts once; the real-vLLM tier is one unit as a whole, since its vLLM
servers are shared by all its modules and each takes a core; so is every module that runs
against the local Kubernetes control plane, which one process starts for all of them.

Property tests (Hypothesis) run without a per-example deadline: on a shared, busy machine an
example that takes 0.3 s instead of 0.2 s says nothing about the code, and a timing limit would
make a correct test fail at random.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from xdist.scheduler import LoadScopeScheduling

pytest_plugins = ["tests.fakekube.plugin"]

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

REAL_VLLM_TIER = "tests/realvllm/"
CONTROL_PLANE = "the local control plane"
CONTROL_PLANE_MODULES = (
    "tests/cluster/",
    "tests/integration/test_kube_source.py",
    "tests/integration/test_leader.py",
    "tests/integration/test_controller.py",
)


class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type hints
    """xdist's scope scheduler with our units: a test module each; the real-vLLM tier as one, and
    the modules on the local control plane as one.

    (xdist's own `loadgroup` marks would say the same, but its grouping is lost on pytest ≥ 9.2,
    pytest-xdist issue 1386.)"""

    def _split_scope(self, nodeid: str) -> str:
        module: str = nodeid.split("::", 1)[0]
        if module.startswith(REAL_VLLM_TIER):
            return REAL_VLLM_TIER
        if module.startswith(CONTROL_PLANE_MODULES):
            return CONTROL_PLANE
        return module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleScheduling:
    return ModuleScheduling(config, log)

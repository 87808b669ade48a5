"""The harness's pool file is one the EPP accepts, and pod addresses share a free port."""

from __future__ import annotations

import random

import pytest

from epp.picker.datastore.types import FailureMode
from epp.picker.sources.file import parse_pool_file
from epp.tools.localstack import pick_pod_addresses, pool_yaml


@pytest.mark.parametrize(
    ("failure_mode", "ready"),
    [(FailureMode.FAIL_OPEN, True), (FailureMode.FAIL_CLOSE, False)],
    ids=["fail-open-ready", "fail-close-not-ready"],
)
def test_pool_yaml_is_a_valid_pool_file(failure_mode: FailureMode, ready: bool) -> None:
    text = pool_yaml("p", [("sim-0", "127.9.9.2"), ("sim-1", "127.9.9.3")], 8123, failure_mode, ready=ready)
    parsed = parse_pool_file(text, source="test", pool_name="", pool_namespace="")
    assert parsed.pool.name == "p"
    assert parsed.pool.target_ports == (8123,)
    assert parsed.pool.failure_mode is failure_mode
    assert [(pod.name, pod.ip, pod.ready) for pod in parsed.pods] == [
        ("sim-0", "127.9.9.2", ready),
        ("sim-1", "127.9.9.3", ready),
    ]


def test_pick_pod_addresses_gives_distinct_loopback_addresses_and_one_port() -> None:
    hosts, port = pick_pod_addresses(5, random.Random(3))
    assert len(set(hosts)) == 5
    assert all(h.startswith("127.") for h in hosts)
    assert 0 < port < 65536

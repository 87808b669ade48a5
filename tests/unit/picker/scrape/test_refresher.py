"""Refresher settings a user gets wrong get a clear error; scrape URLs are built as documented."""

from __future__ import annotations

from typing import Any

import pytest

from epp.clock import FakeClock
from epp.errors import ConfigError
from epp.picker.datastore import Datastore, Endpoint
from epp.picker.scrape.refresher import MetricsRefresher, ScrapePacing, ScrapeTarget

_PACING = ("interval_s", "timeout_s", "max_body_bytes", "backoff_cap_s")


def refresher(**kwargs: Any) -> MetricsRefresher:
    """A refresher with `kwargs` sorted into its pacing (interval, timeout, limits) and its target."""
    pacing: dict[str, Any] = {"interval_s": 0.1}
    pacing.update({k: v for k, v in kwargs.items() if k in _PACING})
    target = {k: v for k, v in kwargs.items() if k not in _PACING}
    clock = FakeClock()
    return MetricsRefresher(Datastore(clock), clock, ScrapePacing(**pacing), target=ScrapeTarget(**target))


def endpoint(ip: str, port: int = 8000) -> Endpoint:
    return Endpoint(name="pod-rank-0", pod_name="pod", namespace="ns", ip=ip, port=port)


@pytest.mark.parametrize(
    ("kwargs", "target", "url"),
    [
        ({}, endpoint("10.0.0.7"), "http://10.0.0.7:8000/metrics"),
        ({"port": 9090}, endpoint("10.0.0.7"), "http://10.0.0.7:9090/metrics"),
        (
            {"scheme": "https", "path": "/custom/metrics"},
            endpoint("10.0.0.7"),
            "https://10.0.0.7:8000/custom/metrics",
        ),
        ({}, endpoint("fd00::7"), "http://[fd00::7]:8000/metrics"),
    ],
    ids=["default", "port-override", "https-and-path", "ipv6"],
)
def test_scrape_url(kwargs: dict[str, Any], target: Endpoint, url: str) -> None:
    assert refresher(**kwargs).url_for(target) == url


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_s": 0.0}, "interval must be positive"),
        ({"interval_s": float("nan")}, "interval must be positive"),
        ({"timeout_s": -1.0}, "timeout must be positive"),
        ({"scheme": "ftp"}, "scheme must be http or https"),
        ({"port": 0}, "port must be in 1..65535"),
        ({"port": 70000}, "port must be in 1..65535"),
        ({"path": "metrics"}, "must start with '/'"),
        ({"max_body_bytes": 0}, "body limit must be positive"),
    ],
    ids=[
        "zero-interval",
        "nan-interval",
        "negative-timeout",
        "bad-scheme",
        "port-zero",
        "port-high",
        "relative-path",
        "no-body",
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        refresher(**kwargs)


def test_no_stats_before_running() -> None:
    assert refresher().stats() == {}

"""`epp serve`'s settings: a tree of frozen dataclasses (`tree`), the flags built from it (`parser`),
and the one place the flags become settings and are checked (`edge`)."""

from __future__ import annotations

from epp.serve.settings.edge import settings_from_args
from epp.serve.settings.parser import configure_parser
from epp.serve.settings.tree import (
    POLICIES,
    AdapterSettings,
    DrainSettings,
    LeaderSettings,
    ListenSettings,
    LogSettings,
    ObservabilitySettings,
    PeerSettings,
    PoolSettings,
    SchedulingSettings,
    ScrapeSettings,
    ServeSettings,
)

__all__ = [
    "POLICIES",
    "AdapterSettings",
    "DrainSettings",
    "LeaderSettings",
    "ListenSettings",
    "LogSettings",
    "ObservabilitySettings",
    "PeerSettings",
    "PoolSettings",
    "SchedulingSettings",
    "ScrapeSettings",
    "ServeSettings",
    "configure_parser",
    "settings_from_args",
]

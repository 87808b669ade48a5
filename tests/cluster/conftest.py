"""The cluster tier: the project against a real Kubernetes API server (the local control plane
the `local_control_plane` fixture starts; see `tests/fakekube/plugin.py`)."""

from __future__ import annotations

import pytest

from testkit.localcluster import LocalCluster


@pytest.fixture(scope="session")
def cluster(local_control_plane: LocalCluster) -> LocalCluster:
    return local_control_plane

"""A faithful fake Kubernetes API server for tests (see `tests.fakekube.server`)."""

from tests.fakekube.server import ApiCall, FakeKube

__all__ = ["ApiCall", "FakeKube"]

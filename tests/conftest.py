import pathlib

import pytest

pytest_plugins = ["tests.fakekube.plugin"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-vLLM tier runs first, on a quiet machine, and its servers stop before the rest.

    Run after the other tiers (left-over load, 2 cores), the real servers' gauges missed
    short-lived states the tier waits for; alone they do not.
    """
    items.sort(key=lambda item: 0 if "realvllm" in pathlib.Path(str(item.fspath)).parts else 1)

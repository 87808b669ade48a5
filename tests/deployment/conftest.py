"""The deployment tier: checks of what a user applies or installs rather than of the code that
runs: the Helm chart, the kustomize manifests (and that they are the chart's render), the CRDs,
the objects the LLMInferenceService controller creates, the Dockerfile, the shell scripts and the
wheel. They run the real helm, kubectl, hadolint, shellcheck and openssl where installed and skip,
each with one line that says what to install, where not.

Every test here carries the `deployment` marker: `pytest -m "not integration and not deployment"`
is the fast unit run, `pytest tests/deployment` this tier alone."""

from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.deployment)

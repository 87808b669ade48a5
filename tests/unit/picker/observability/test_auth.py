"""Bearer-token auth on the metrics port."""

from __future__ import annotations

import logging
import pathlib

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from epp.errors import ConfigError
from epp.picker.observability.auth import bearer_auth_middleware, read_token_file
from epp.picker.observability.http import build_app

TOKEN = "s3cr3t-token-value"


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/metrics", {}, 401),
        ("/metrics", {"Authorization": "Bearer wrong"}, 401),
        ("/metrics", {"Authorization": TOKEN}, 401),
        ("/metrics", {"Authorization": f"Bearer {TOKEN}"}, 200),
        ("/healthz", {}, 200),
    ],
    ids=["missing", "wrong", "no-scheme", "right", "healthz-open"],
)
async def test_metrics_need_the_token(
    path: str, headers: dict[str, str], status: int, caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(CollectorRegistry())
    app.middlewares.append(bearer_auth_middleware(TOKEN))
    client: TestClient = TestClient(TestServer(app, host="127.0.0.1"))  # type: ignore[type-arg]
    await client.start_server()
    try:
        with caplog.at_level(logging.DEBUG):
            response = await client.get(path, headers=headers)
            body = await response.text()
        assert response.status == status
        assert TOKEN not in body
        assert TOKEN not in caplog.text
        if status == 401:
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    finally:
        await client.close()


def test_token_file_is_read_and_stripped(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert read_token_file(path) == TOKEN


@pytest.mark.parametrize("content", [None, "\n"], ids=["missing", "empty"])
def test_a_missing_or_empty_token_file_is_a_config_error(tmp_path: pathlib.Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="token file"):
        read_token_file(path)

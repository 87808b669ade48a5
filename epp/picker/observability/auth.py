"""Optional bearer-token auth for the metrics port (`--metrics-auth-token-file`).

When a token is configured every route except `/healthz` needs `Authorization: Bearer <token>`;
anything else is a 401 with a `WWW-Authenticate` challenge. The comparison is constant-time and
the token never appears in logs or error bodies.
"""

from __future__ import annotations

import hmac
import logging
import pathlib
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from epp.errors import ConfigError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz"})


def read_token_file(path: pathlib.Path) -> str:
    """The token in `path`, surrounding whitespace removed; a missing or empty file is a ConfigError."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the metrics auth token file {path}: {err}") from err
    if not token:
        raise ConfigError(f"the metrics auth token file {path} is empty")
    return token


def bearer_auth_middleware(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            log.info("metrics request refused: bad or missing bearer token", extra={"path": request.path})
            return web.Response(
                status=401, text="unauthorized\n", headers={"WWW-Authenticate": 'Bearer realm="epp"'}
            )
        return await handler(request)

    return middleware

"""Binding the picker's gRPC servers to their ports: one address format, one clear error."""

from __future__ import annotations

import grpc

from epp.errors import ConfigError


class ListenError(ConfigError):
    """A port could not be bound (in use, or a bad address)."""


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Add a listening port; a port in use is a ConfigError (no SO_REUSEPORT sharing)."""
    port: int
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as err:
        raise ListenError(f"cannot listen on {address}: {err}") from err
    if port == 0:
        raise ListenError(f"cannot listen on {address}: address in use or unavailable")
    return port


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

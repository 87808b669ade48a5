"""Server helpers: certificate reload on file change, and binding errors."""

from __future__ import annotations

import os
import pathlib
import socket

import grpc
import pytest

from epp import tls
from epp.picker.extproc.server import SERVER_OPTIONS, CertReloader
from epp.picker.listen import ListenError, bind


def write_pair(directory: pathlib.Path, mtime: float) -> tls.KeyPair:
    pair = tls.self_signed()
    for name, content in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        path = directory / name
        path.write_bytes(content)
        os.utime(path, (mtime, mtime))
    return pair


def test_reloader_returns_new_config_only_when_files_change(tmp_path: pathlib.Path) -> None:
    write_pair(tmp_path, 1_000_000)
    reloader = CertReloader(tmp_path)
    assert reloader.initial() is not None
    assert reloader() is None
    write_pair(tmp_path, 2_000_000)
    assert reloader() is not None
    assert reloader() is None


def test_reloader_keeps_current_cert_when_new_files_are_bad(tmp_path: pathlib.Path) -> None:
    write_pair(tmp_path, 1_000_000)
    reloader = CertReloader(tmp_path)
    (tmp_path / "tls.crt").write_bytes(b"half-written")
    assert reloader() is None


async def test_bind_refuses_a_port_in_use() -> None:
    assert ("grpc.so_reuseport", 0) in SERVER_OPTIONS
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = grpc.aio.server(options=SERVER_OPTIONS)
        with pytest.raises(ListenError, match="cannot listen"):
            bind(server, f"127.0.0.1:{holder.getsockname()[1]}", None)

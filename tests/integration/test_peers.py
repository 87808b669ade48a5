"""Active-active `epp serve` replicas with `--peers`: each learns what the other routed, over the
real gRPC peer exchange (mutual TLS, or plaintext with `--peer-insecure`), and forgets a replica
that stops. Peers without a certificate from the pool's CA, or of another pool, are refused and
counted (`inference_extension_peer_refused_total`)."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from epp import tls
from epp._proto import peers_pb2 as peers_pb
from epp._proto import peers_pb2_grpc as peers_grpc
from epp.errors import ConfigError
from epp.picker.peers import peer_identity
from epp.serve.settings import PoolSettings, ServeSettings
from epp.tools.localstack import write_peer_tls
from tests.integration.test_serve_grpc import (
    FakePods,
    Running,
    body_message,
    destination,
    exchange,
    finish,
    free_port,
    headers_message,
    settings,
    start,
    write_pool,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADAPTER_BODY = b'{"model":"sql-lora","prompt":"hello"}'


async def debug(running: Running, path: str) -> dict[str, object]:
    """A debug page, fetched without blocking the event loop both replicas serve on."""
    url = f"http://127.0.0.1:{running.ports.metrics}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        payload: dict[str, object] = await response.json()
    return payload


async def peer_ids(running: Running) -> list[str]:
    peers = (await debug(running, "/debug/peers"))["peers"]
    assert isinstance(peers, list)
    return [p["id"] for p in peers]


async def received(running: Running) -> int:
    value = (await debug(running, "/debug/peers"))["batches_received"]
    assert isinstance(value, int)
    return value


async def until(check: Callable[[], Awaitable[bool]], what: str, *, within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s:g}s: {what}")
        await asyncio.sleep(0.02)


async def last_decision(running: Running) -> dict[str, object]:
    decisions = (await debug(running, "/debug/decisions"))["decisions"]
    assert isinstance(decisions, list)
    newest: dict[str, object] = decisions[0]
    return newest


async def route(running: Running) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
        replies = await exchange(channel, [headers_message(), body_message(ADAPTER_BODY, True)])
    return destination(replies[0])


IDENTITY = peer_identity("default", "pool")  # what `settings` serves


def peer_tls(files: tuple[pathlib.Path, pathlib.Path, pathlib.Path] | None) -> dict[str, object]:
    if files is None:
        return {"insecure": True}
    ca, cert, key = files
    return {"tls_ca": ca, "tls_cert": cert, "tls_key": key}


def replica(
    pool: pathlib.Path, peers: str, port: int, files: tuple[pathlib.Path, pathlib.Path, pathlib.Path] | None
) -> ServeSettings:
    return settings(
        pool,
        scheduling={"policy": None},
        peers={"addresses": peers, "port": port, "interval_s": 0.02, **peer_tls(files)},
    )


async def refused(running: Running) -> dict[str, float]:
    """`inference_extension_peer_refused_total` by reason, from the replica's /metrics."""
    url = f"http://127.0.0.1:{running.ports.metrics}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "inference_extension_peer_refused"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


@pytest.mark.parametrize("mutual_tls", [True, False], ids=["mutual-tls", "peer-insecure"])
async def test_a_replica_routes_on_what_its_peer_loaded_and_forgets_a_stopped_peer(
    tmp_path: pathlib.Path, mutual_tls: bool
) -> None:
    pods = FakePods()
    await pods.start()
    pool = write_pool(tmp_path, pods.port)
    port_a, port_b = free_port(), free_port()
    peers = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"  # each lists itself too, as a Service would
    ca = tls.new_ca()  # one CA for the pool; each replica its own certificate
    files_a = write_peer_tls(tmp_path / "a", dns_name=IDENTITY, ca=ca) if mutual_tls else None
    files_b = write_peer_tls(tmp_path / "b", dns_name=IDENTITY, ca=ca) if mutual_tls else None
    a = await start(replica(pool, peers, port_a, files_a))
    b = await start(replica(pool, peers, port_b, files_b))
    try:
        await pods.wait_scraped()
        assert (await debug(a, "/debug/peers"))["tls"] is mutual_tls
        id_a = (await debug(a, "/debug/peers"))["id"]
        id_b = (await debug(b, "/debug/peers"))["id"]

        async def both_hear() -> bool:
            return await peer_ids(b) == [id_a] and await peer_ids(a) == [id_b]

        await until(both_hear, "each hears the other")
        assert (await debug(a, "/debug/peers"))["sending_to"] == [f"127.0.0.1:{port_b}"]  # not to itself

        served_by_a = await route(a)
        assert (await last_decision(a))["reason"] == "planned-free-slot"  # nobody had the adapter
        seen = await received(b)

        async def two_more() -> bool:
            return await received(b) >= seen + 2

        await until(two_more, "B took a batch sent after A routed")
        served_by_b = await route(b)
        assert served_by_b == served_by_a
        # B had routed nothing itself: it learnt from A that the pod holds the adapter.
        assert (await last_decision(b))["reason"] == "adapter-resident"
        assert set((await refused(b)).values()) == {0.0}, "nothing refused between the pool's replicas"
    finally:
        await finish(a)
    try:

        async def forgotten() -> bool:
            return await peer_ids(b) == []

        await until(forgotten, "B forgets the stopped replica")
        assert await route(b)  # and keeps routing
    finally:
        await finish(b)
        await pods.stop()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"scheduling": {"policy": "round-robin"}}, "--peers needs a policy with scheduler state"),
    ],
)
async def test_peers_with_a_stateless_policy_is_a_start_up_error(
    tmp_path: pathlib.Path, overrides: dict[str, dict[str, object]], message: str
) -> None:
    pool = write_pool(tmp_path)
    peers: dict[str, object] = {"addresses": "127.0.0.1:1", "port": 0, "insecure": True}
    with pytest.raises(ConfigError, match=message):
        await start(settings(pool, peers=peers, **overrides))


class Dialer:
    """A peer-exchange client as an outsider would build it: some TLS material, or none."""

    def __init__(self, port: int) -> None:
        self.address = f"127.0.0.1:{port}"

    async def send(self, credentials: grpc.ChannelCredentials | None, *, pool: str = "default/pool") -> None:
        """One batch; raises the RPC's error when it is refused."""
        options = (("grpc.ssl_target_name_override", IDENTITY),)  # trust the server's name: test the server
        channel = (
            grpc.aio.secure_channel(self.address, credentials, options=options)
            if credentials is not None
            else grpc.aio.insecure_channel(self.address)
        )
        async with channel:
            stub = peers_grpc.PeerExchangeStub(channel)
            await stub.Exchange(peers_pb.Batch(sender="intruder", pool=pool), timeout=5)


def client_credentials(ca: tls.KeyPair, leaf: tls.KeyPair | None) -> grpc.ChannelCredentials:
    if leaf is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem)
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem, private_key=leaf.key_pem, certificate_chain=leaf.cert_pem
    )


async def test_peers_without_the_pools_certificate_or_of_another_pool_are_refused_and_counted(
    tmp_path: pathlib.Path,
) -> None:
    pool = write_pool(tmp_path)
    ca = tls.new_ca()
    port = free_port()
    a = await start(
        replica(pool, f"127.0.0.1:{port}", port, write_peer_tls(tmp_path / "a", dns_name=IDENTITY, ca=ca))
    )
    dial = Dialer(port)
    other_ca = tls.new_ca()
    try:
        attempts: list[tuple[str, grpc.ChannelCredentials | None]] = [
            ("no-certificate", client_credentials(ca, None)),
            ("untrusted-certificate", client_credentials(ca, tls.self_signed(common_name=IDENTITY))),
            ("untrusted-certificate", client_credentials(ca, tls.issue(other_ca, dns_names=[IDENTITY]))),
            (
                "foreign-identity",
                client_credentials(ca, tls.issue(ca, dns_names=[peer_identity("default", "other")])),
            ),
            ("handshake", None),  # plaintext gRPC on the TLS port
        ]
        for reason, credentials in attempts:
            before = (await refused(a))[reason]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await dial.send(credentials)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, reason

            async def counted(reason: str = reason, before: float = before) -> bool:
                return (await refused(a))[reason] > before

            await until(counted, f"the {reason} refusal is counted")

        # The pool's certificate, but a batch for another pool: refused by the exchange itself.
        member = client_credentials(ca, tls.issue(ca, dns_names=[IDENTITY]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await dial.send(member, pool="default/other")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await refused(a))["foreign-pool"] == 1
        await dial.send(member)  # and the same peer with a batch for this pool is heard
        assert await received(a) == 1
        assert await peer_ids(a) == ["intruder"]
    finally:
        await finish(a)


async def test_replicas_of_two_pools_sharing_a_ca_do_not_hear_each_other(tmp_path: pathlib.Path) -> None:
    pool = write_pool(tmp_path)
    ca = tls.new_ca()
    port_a, port_b = free_port(), free_port()
    peers = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
    a = await start(replica(pool, peers, port_a, write_peer_tls(tmp_path / "a", dns_name=IDENTITY, ca=ca)))
    other = peer_identity("default", "other")
    b_files = write_peer_tls(tmp_path / "b", dns_name=other, ca=ca)
    b = await start(
        dataclasses.replace(
            replica(pool, peers, port_b, b_files),
            pool=PoolSettings(name="other", namespace="default", file=write_other_pool(tmp_path)),
        )
    )
    try:

        async def both_refuse() -> bool:
            return sum((await refused(a)).values()) > 0 and sum((await refused(b)).values()) > 0

        await until(both_refuse, "each replica refuses the other")
        assert await peer_ids(a) == [] and await peer_ids(b) == []
        assert await received(a) == 0 and await received(b) == 0
    finally:
        await finish(a)
        await finish(b)


def write_other_pool(tmp_path: pathlib.Path) -> pathlib.Path:
    """The same pods as pool `pool`, in a pool named `other`."""
    path = tmp_path / "other.yaml"
    path.write_text(write_pool(tmp_path).read_text().replace("name: pool", "name: other", 1))
    return path


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"ca": None}, "--peer-tls-ca .*ca.crt: cannot read"),
        ({"cert": b"junk"}, "--peer-tls-cert .*tls.crt: not a PEM certificate"),
        ({"key": "other"}, "--peer-tls-key .*tls.key is not the key of --peer-tls-cert"),
        ({"ca": "other"}, "--peer-tls-cert .*tls.crt is not signed by --peer-tls-ca"),
        (
            {"identity": "other"},
            "names other.default.epp-peers; peers of this pool expect pool.default.epp-peers",
        ),
    ],
    ids=[
        "missing-ca",
        "garbage-cert",
        "key-of-another-cert",
        "cert-of-another-ca",
        "cert-of-another-pool",
    ],
)
async def test_bad_peer_certificates_are_start_up_errors_naming_the_file(
    tmp_path: pathlib.Path, files: dict[str, object], message: str
) -> None:
    pool = write_pool(tmp_path)
    ca = tls.new_ca()
    ca_path, cert_path, key_path = write_peer_tls(
        tmp_path / "tls", dns_name=peer_identity("default", str(files.get("identity", "pool"))), ca=ca
    )
    if "ca" in files:
        if files["ca"] is None:
            ca_path.unlink()
        else:
            ca_path.write_bytes(tls.new_ca().cert_pem)
    if files.get("cert") is not None:
        cert_path.write_bytes(b"junk")
    if files.get("key") == "other":
        key_path.write_bytes(tls.issue(ca, dns_names=[IDENTITY]).key_pem)
    with pytest.raises(ConfigError, match=message):
        await start(
            settings(
                pool,
                scheduling={"policy": None},
                peers={"addresses": "127.0.0.1:1", "port": 0, **peer_tls((ca_path, cert_path, key_path))},
            )
        )


def handshake_hello_first(port: int, context: ssl.SSLContext, hello_sent: threading.Event) -> str | None:
    """A TLS client whose ClientHello is on the wire before the server's loop has even accepted
    the connection (that loop is blocked until `hello_sent`); returns the negotiated ALPN."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls_client = context.wrap_bio(incoming, outgoing, server_hostname=IDENTITY)
        while True:
            try:
                tls_client.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                hello_sent.set()
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection during the handshake") from None
                incoming.write(data)
        sock.sendall(outgoing.read())
        return tls_client.selected_alpn_protocol()


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_peer_whose_hello_arrives_before_the_replica_accepts_is_admitted(
    tmp_path: pathlib.Path, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """On each loop `epp serve` may run (uvloop when installed): a hello that is already waiting
    when the connection is accepted must reach the TLS layer, not a stream buffer."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(hello_first(tmp_path))


async def hello_first(tmp_path: pathlib.Path) -> None:
    pool = write_pool(tmp_path)
    port = free_port()
    ca_path, cert_path, key_path = write_peer_tls(tmp_path / "a", dns_name=IDENTITY)
    a = await start(replica(pool, f"127.0.0.1:{port}", port, (ca_path, cert_path, key_path)))
    context = ssl.create_default_context(cafile=str(ca_path))
    context.load_cert_chain(cert_path, key_path)
    context.set_alpn_protocols(["h2"])
    hello_sent = threading.Event()
    try:
        client = asyncio.get_running_loop().run_in_executor(
            None, handshake_hello_first, port, context, hello_sent
        )
        assert hello_sent.wait(10)  # blocks the replica's loop: the hello waits in the socket
        assert await client == "h2"
        assert set((await refused(a)).values()) == {0.0}
    finally:
        await finish(a)

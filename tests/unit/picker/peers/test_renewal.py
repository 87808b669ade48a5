"""Renewed peer certificates: the peer port presents them without a restart; a bad renewal
changes nothing and is counted."""

from __future__ import annotations

import asyncio
import pathlib
import ssl

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry

from epp import tls
from epp.clock import FakeClock
from epp.picker.peers import (
    PeerRefusals,
    PeerTls,
    PeerTlsFiles,
    PeerTlsRenewal,
    Reload,
    load_peer_tls,
    peer_identity,
)
from epp.picker.peers.gate import PeerGate
from epp.tools.localstack import write_peer_tls

IDENTITY = peer_identity("default", "pool")


class PeerPort:
    """A gate on loopback, the renewal that feeds it, and a client that reads what it presents."""

    def __init__(self, directory: pathlib.Path, ca: tls.KeyPair) -> None:
        self.files = PeerTlsFiles(*write_peer_tls(directory, dns_name=IDENTITY, ca=ca))
        self.ca = ca
        self.registry = CollectorRegistry()
        self.applied: list[PeerTls] = []
        start = load_peer_tls(self.files, IDENTITY)
        self.gate = PeerGate(
            start, PeerRefusals(self.registry, FakeClock()), backend=str(directory / "none.sock")
        )

        async def apply(renewed: PeerTls) -> None:
            self.gate.use(renewed)
            self.applied.append(renewed)

        self.renewal = PeerTlsRenewal(start, apply, clock=FakeClock(), registry=self.registry)
        self.port = 0

    async def __aenter__(self) -> PeerPort:
        self.port = await self.gate.bind("127.0.0.1", 0)
        await self.gate.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.gate.close()

    async def presented_serial(self) -> int:
        """The serial number of the certificate the peer port shows a member of the pool."""
        member = tls.issue(self.ca, dns_names=[IDENTITY])
        directory = self.files.ca.parent / "client"
        directory.mkdir(exist_ok=True)
        (directory / "tls.crt").write_bytes(member.cert_pem)
        (directory / "tls.key").write_bytes(member.key_pem)
        context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        context.check_hostname = False
        context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
        context.set_alpn_protocols(["h2"])
        _, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=context)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
        return x509.load_der_x509_certificate(der).serial_number

    def reloads(self, result: str) -> float:
        value = self.registry.get_sample_value(
            "inference_extension_peer_tls_reloads_total", {"result": result}
        )
        return value or 0.0


def serial_of(path: pathlib.Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


async def test_a_renewed_certificate_is_presented_by_the_next_handshake(tmp_path: pathlib.Path) -> None:
    ca = tls.new_ca()
    async with PeerPort(tmp_path / "peer", ca) as port:
        first = serial_of(port.files.cert)
        assert await port.presented_serial() == first
        assert await port.renewal.check() is Reload.UNCHANGED

        write_peer_tls(tmp_path / "peer", dns_name=IDENTITY, ca=ca)  # what the kubelet does on renewal
        renewed = serial_of(port.files.cert)
        assert renewed != first
        assert await port.renewal.check() is Reload.APPLIED
        assert await port.presented_serial() == renewed
        assert [t.cert_pem for t in port.applied] == [port.files.cert.read_bytes()]
        assert port.reloads("applied") == 1 and port.reloads("rejected") == 0


@pytest.mark.parametrize(
    "damage",
    ["key-of-another-certificate", "another-pool", "unreadable"],
)
async def test_a_bad_renewal_keeps_the_certificates_in_use(tmp_path: pathlib.Path, damage: str) -> None:
    ca = tls.new_ca()
    async with PeerPort(tmp_path / "peer", ca) as port:
        first = serial_of(port.files.cert)
        if damage == "key-of-another-certificate":
            port.files.key.write_bytes(tls.issue(ca, dns_names=[IDENTITY]).key_pem)
        elif damage == "another-pool":
            write_peer_tls(tmp_path / "peer", dns_name=peer_identity("default", "other"), ca=ca)
        else:
            port.files.cert.unlink()
        assert await port.renewal.check() is Reload.REJECTED
        assert port.applied == []
        assert await port.presented_serial() == first
        assert port.reloads("rejected") == 1
        assert x509.load_pem_x509_certificate(port.renewal.current.cert_pem).serial_number == first

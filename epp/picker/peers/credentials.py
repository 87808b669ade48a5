"""The peer exchange's mutual TLS material: one CA per pool, one certificate per replica.

Every replica serves its peer port with its certificate and accepts only clients whose
certificate the pool's CA signed and that names the pool (`peer_identity`); it dials its peers
with the same certificate and accepts only servers that pass the same two checks. The identity
is a DNS name in the certificate (SAN, or CN when it has none): replicas are dialled by pod IP,
which no certificate made before the pod exists can name, so the pool's identity stands in for
the host name on both ends.

Files are read and checked once at start-up, so a wrong path, a key that does not match its
certificate, a certificate the CA did not sign, or one for another pool stops `epp serve` with
a message naming the file, instead of every peer refusing the replica later.
"""

from __future__ import annotations

import pathlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from epp.errors import ConfigError

IDENTITY_SUFFIX = "epp-peers"


def peer_identity(pool_namespace: str, pool_name: str) -> str:
    """The DNS name every replica's certificate carries for pool `pool_namespace/pool_name`."""
    return f"{pool_name}.{pool_namespace}.{IDENTITY_SUFFIX}"


@dataclass(frozen=True, slots=True)
class PeerTlsFiles:
    """The three `--peer-tls-*` files, as given."""

    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


@dataclass(frozen=True, slots=True)
class PeerTls:
    """Checked material for one replica: its files, their content, and the pool's identity."""

    files: PeerTlsFiles
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    identity: str

    def server_context(self) -> ssl.SSLContext:
        """For the peer port: our certificate, a client certificate from the CA required, HTTP/2."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.ca_pem.decode("ascii", errors="replace"))
        context.load_cert_chain(self.files.cert, self.files.key)
        context.set_alpn_protocols(["h2"])  # gRPC clients insist on it
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """For dialling a peer: our certificate presented, the peer's verified against the CA."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        """The peer's certificate must name the pool (peers are dialled by IP, not by that name)."""
        return (("grpc.ssl_target_name_override", self.identity), ("grpc.default_authority", self.identity))


def certificate_names(peercert: Mapping[str, Any]) -> list[str]:
    """DNS names of a certificate as `ssl` decodes it: its SANs, else its CN (as TLS clients do)."""
    sans = [str(value) for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    if sans:
        return sans
    return [str(value) for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]


def load_peer_tls(files: PeerTlsFiles, identity: str) -> PeerTls:
    """Read and check the three files; a ConfigError names the flag and file at fault."""
    ca_pem = _read("--peer-tls-ca", files.ca)
    cert_pem = _read("--peer-tls-cert", files.cert)
    key_pem = _read("--peer-tls-key", files.key)
    ca = _certificate("--peer-tls-ca", files.ca, ca_pem)
    cert = _certificate("--peer-tls-cert", files.cert, cert_pem)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"--peer-tls-key {files.key}: not an unencrypted PEM private key: {err}") from err
    if key.public_key() != cert.public_key():
        raise ConfigError(f"--peer-tls-key {files.key} is not the key of --peer-tls-cert {files.cert}")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as err:
        raise ConfigError(
            f"--peer-tls-cert {files.cert} is not signed by --peer-tls-ca {files.ca}: peers would refuse it"
        ) from err
    names = _names(cert)
    if identity not in names:
        raise ConfigError(
            f"--peer-tls-cert {files.cert} names {', '.join(names) or 'nothing'}; peers of this pool "
            f"expect {identity} (a DNS SAN)"
        )
    return PeerTls(files, ca_pem, cert_pem, key_pem, identity)


def _read(flag: str, path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot read: {err.strerror}") from err


def _certificate(flag: str, path: pathlib.Path, pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as err:
        raise ConfigError(f"{flag} {path}: not a PEM certificate: {err}") from err


def _names(cert: x509.Certificate) -> list[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return [str(name) for name in sans.get_values_for_type(x509.DNSName)]

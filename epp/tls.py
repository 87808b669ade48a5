"""TLS material: for the ext_proc server a self-signed certificate made in memory, or files; for
the peer exchange (mutual TLS between active-active replicas) a CA and the certificates it signs.

Data planes are configured to accept the EPP's certificate without verification (upstream
does the same), so a fresh self-signed certificate per start is enough when no files are given.
Peers verify each other, so their certificates come from one CA per pool (`new_ca`, `issue`:
what tests and the local stack use; clusters get theirs from the chart or a script).
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp.errors import ConfigError

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def self_signed(
    *, common_name: str = "epp", valid_days: int = 3650, now: datetime.datetime | None = None
) -> KeyPair:
    """A P-256 key and a self-signed certificate for `common_name`, localhost and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = now if now is not None else datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))
        .not_valid_after(start + datetime.timedelta(days=valid_days))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(common_name),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _pair(cert, key)


def new_ca(
    *, common_name: str = "lora-epp peer CA", valid_days: int = 3650, now: datetime.datetime | None = None
) -> KeyPair:
    """A P-256 key and a self-signed CA certificate that may sign leaf certificates only."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _validity(x509.CertificateBuilder(), now, valid_days)
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _pair(cert, key)


def issue(
    ca: KeyPair,
    *,
    dns_names: list[str],
    valid_days: int = 3650,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A certificate signed by `ca` for `dns_names` (the first is also the CN), good for both ends
    of a TLS connection (server and client authentication), as a peer replica needs."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _validity(x509.CertificateBuilder(), now, valid_days)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pair(cert, key)


def _validity(
    builder: x509.CertificateBuilder, now: datetime.datetime | None, valid_days: int
) -> x509.CertificateBuilder:
    start = now if now is not None else datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(start - datetime.timedelta(minutes=5)).not_valid_after(
        start + datetime.timedelta(days=valid_days)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    return KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def load_key_pair(cert_dir: pathlib.Path) -> KeyPair:
    """`tls.crt` and `tls.key` from `cert_dir` (a mounted Secret); ConfigError naming what is wrong."""
    cert_path = cert_dir / CERT_FILE
    key_path = cert_dir / KEY_FILE
    try:
        cert_pem = cert_path.read_bytes()
        key_pem = key_path.read_bytes()
    except OSError as err:
        raise ConfigError(f"--cert-path {cert_dir}: cannot read {err.filename}: {err.strerror}") from err
    try:
        x509.load_pem_x509_certificate(cert_pem)
        serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as err:
        raise ConfigError(f"--cert-path {cert_dir}: invalid certificate or key: {err}") from err
    return KeyPair(cert_pem=cert_pem, key_pem=key_pem)


def cert_files_mtime(cert_dir: pathlib.Path) -> tuple[float, float] | None:
    """Modification times of the two files, for change detection; None when either is missing."""
    try:
        return ((cert_dir / CERT_FILE).stat().st_mtime, (cert_dir / KEY_FILE).stat().st_mtime)
    except OSError:
        return None

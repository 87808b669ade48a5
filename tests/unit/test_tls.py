"""Self-signed certificates, cert-path loading, and the peer CA with the certificates it issues."""

from __future__ import annotations

import pathlib

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID

from epp import tls
from epp.errors import ConfigError


def test_self_signed_pair_is_valid_for_localhost() -> None:
    pair = tls.self_signed(common_name="epp")
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert b"PRIVATE KEY" in pair.key_pem


def test_load_key_pair(tmp_path: pathlib.Path) -> None:
    pair = tls.self_signed()
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    assert tls.load_key_pair(tmp_path) == pair
    assert tls.cert_files_mtime(tmp_path) is not None


@pytest.mark.parametrize(
    ("files", "message"),
    [({}, "cannot read"), ({"tls.crt": b"junk", "tls.key": b"junk"}, "invalid certificate or key")],
    ids=["missing", "garbage"],
)
def test_bad_cert_path(tmp_path: pathlib.Path, files: dict[str, bytes], message: str) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        tls.load_key_pair(tmp_path)


def test_issued_certificate_is_signed_by_its_ca_for_both_ends_of_a_connection() -> None:
    ca = tls.new_ca()
    leaf = tls.issue(ca, dns_names=["pool.ns.epp-peers"])
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    cert.verify_directly_issued_by(ca_cert)  # raises if not
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["pool.ns.epp-peers"]
    usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    with pytest.raises(InvalidSignature):
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(tls.new_ca().cert_pem))

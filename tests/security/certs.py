"""A CA and certificates for tests, made with `cryptography` (PEM files in a directory)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class Certificates:
    """`ca.pem`; `<name>.pem` (certificate and key, a PEM key store) and `<name>.key`/`<name>.crt`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ca_key = _key()
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "onceflow test CA")])
        self._ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = directory / "ca.pem"
        self.ca.write_bytes(self._ca.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, common_name: str, expired: bool = False, server: bool = False) -> Path:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        start, end = (
            (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1))
            if expired
            else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "onceflow"),
                        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                    ]
                )
            )
            .issuer_name(self._ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        certificate = builder.sign(self._ca_key, hashes.SHA256())
        crt = certificate.public_bytes(serialization.Encoding.PEM)
        (self.directory / f"{name}.crt").write_bytes(crt)
        (self.directory / f"{name}.key").write_bytes(_pem(key))
        store = self.directory / f"{name}.pem"
        store.write_bytes(_pem(key) + crt)
        return store

"""A throwaway PKI for local clusters and tests (`octavo dev up --tls`): a CA and leaf certificates signed by
it, EC P-256, written as PEM files. Not for production: there, cert-manager or your own CA issues them
(docs/security.md)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SANS = ("localhost", "127.0.0.1", "::1")
VALID_DAYS = 90


@dataclass(frozen=True)
class Issued:
    cert_file: str
    key_file: str
    ca_file: str


class CertificateAuthority:
    def __init__(self, name: str = "octavo-dev-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, sans: Sequence[str] = DEFAULT_SANS, server: bool = True, client: bool = True,
              not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None,
              organization: str = "") -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for `common_name` (and `organization`: Kubernetes reads a client
        certificate's O as the user's group), with DNS names and IP addresses in `sans`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
            ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
                                    + ([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)]
                                       if organization else [])))
            .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
            .not_valid_after(not_after or now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return (cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))

    def write_ca(self, directory: str | Path) -> str:
        path = Path(directory) / "ca.crt"
        _write(path, self.pem)
        return str(path)

    def write(self, directory: str | Path, name: str, common_name: str = "", **kw: object) -> Issued:
        """Issue a certificate and write `<name>.crt` and `<name>.key` (mode 0600) next to `ca.crt`."""
        cert, key = self.issue(common_name or name, **kw)  # type: ignore[arg-type]
        directory = Path(directory)
        _write(directory / f"{name}.crt", cert)
        _write(directory / f"{name}.key", key, private=True)
        return Issued(str(directory / f"{name}.crt"), str(directory / f"{name}.key"), self.write_ca(directory))


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Atomically, so a reader never sees half a file (a renewal replaces files the same way)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)

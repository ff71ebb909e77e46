"""A private certificate authority made by a test, and a server certificate for 127.0.0.1 it
signed: an HTTPS provider stand-in on loopback that no system trust store knows."""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class LoopbackCA:
    bundle: Path  # the CA's certificate (PEM): what a client trusts
    server: ssl.SSLContext  # the stand-in's side: a certificate for 127.0.0.1 the CA signed


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _signed(
    subject: x509.Name,
    public: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def make_ca(directory: Path) -> LoopbackCA:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("proxy test CA")
    usage = x509.KeyUsage(True, False, False, False, False, True, True, False, False)
    ca = _signed(
        ca_name,
        ca_key.public_key(),
        ca_name,
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=0), True), (usage, True)],
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _signed(
        _name("127.0.0.1"),
        leaf_key.public_key(),
        ca_name,
        ca_key,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False,
            ),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ],
    )
    bundle = directory / "ca.pem"
    bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = directory / "server.pem"
    chain.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(chain)
    return LoopbackCA(bundle=bundle, server=server)

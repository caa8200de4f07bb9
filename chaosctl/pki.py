"""A small PKI for one cluster: a CA, the broker's certificate, a client certificate per node.

Built with the ``cryptography`` package rather than the openssl CLI: no subprocess, no
dependence on which openssl flags a box's version has (``-addext``, ``-copy_extensions``),
exact control of every extension, and private keys that are written 0600 from the start.
Keys are ECDSA P-256: small, fast to make, and accepted by mosquitto and Python's ssl alike.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity browsers still accept for a leaf: a familiar bound
# Clocks on edge boxes are often a little off at boot: make certificates valid from a while ago.
BACKDATE = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def san_entry(host: str) -> x509.GeneralName:
    """An IP SAN for an address, a DNS SAN for a name (TLS checks the two kinds apart)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _name(common_name: str, cluster: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"chaos {cluster}"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False))


def make_ca(cluster: str, days: int = CA_DAYS) -> Issued:
    """A self-signed CA that may sign leaves only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"chaos {cluster} CA", cluster)
    cert = (_builder(name, name, key, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(key, cert)


def issue(ca: Issued, cluster: str, common_name: str, *, server_hosts: list[str] | None = None,
          days: int = LEAF_DAYS) -> Issued:
    """A leaf signed by ``ca``: a server certificate for ``server_hosts`` (its SANs), or a
    client certificate when ``server_hosts`` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_hosts else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (_builder(_name(common_name, cluster), ca.cert.subject, key, days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=True, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca.key.public_key()), critical=False))
    if server_hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([san_entry(h) for h in server_hosts]), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def write_file(path: Path, data: bytes, private: bool = False) -> None:
    """Write ``data``; a private file is created 0600, so it is never readable by others,
    not even for a moment (the umask cannot widen it and an older file is re-moded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)

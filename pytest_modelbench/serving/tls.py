"""TLS for what a session serves across nodes, from a certificate authority made for one session.

The controller makes a CA when its exchange starts, signs one certificate for the exchange
(server authentication) and one for the session's workers (client and server
authentication), and forgets the CA's key, so nothing else can ever be signed by it. The
workers' material travels to them over xdist's channel (the ssh connection ``--tx`` already
has), never over the network in clear. Every connection between nodes then requires both
ends' certificates from that CA: a worker's call to the exchange, and a worker's requests
to a vLLM server that a worker of another node serves (vLLM's ``--ssl-*`` flags, the
worker's certificate as the server's). A client without one is refused at the handshake,
before a byte of a request is read, and the bearer tokens travel only encrypted.

Host names are not checked: a worker reaches the controller and other nodes' servers at
addresses found at run time (``$SSH_CONNECTION``, a host name, the address a call came
from); the chain to the session's CA, whose key is gone, is what is verified. Only the
session's own parties hold a certified key.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SessionTls", "TlsUnavailable", "session_tls"]

VALID_DAYS = 30  # longer than any session; the CA's key is gone after the start anyway


class TlsUnavailable(OSError):
    """The ``cryptography`` package, which makes the session's CA, cannot be imported."""


@dataclass(frozen=True)
class SessionTls:
    """One side's TLS material: the session CA's certificate, and its own certificate and
    private key, all PEM."""

    ca: str
    cert: str
    key: str = field(repr=False)  # never in a log or a traceback's locals

    def fields(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.cert, "key": self.key}

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> SessionTls:
        return cls(str(fields["ca"]), str(fields["cert"]), str(fields["key"]))

    def server_context(self) -> ssl.SSLContext:
        """A server's context: its certificate, and clients must show one of the CA's."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(context)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """A worker's context, for the exchange and other nodes' servers: they must show a
        server certificate of the session's CA, and it shows its own."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False  # see the module docstring; the chain is verified
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        context.load_verify_locations(cadata=self.ca)
        with self.files() as (own, _ca):
            context.load_cert_chain(own)

    @contextlib.contextmanager
    def files(self) -> Iterator[tuple[Path, Path]]:
        """(this side's key and certificate, the CA's certificate) as PEM files, for what reads
        them only from a path (the ``ssl`` module, a server's ``--ssl-keyfile``): in a private
        directory (mode 0700, the key 0600) that is removed on leaving."""
        with tempfile.TemporaryDirectory(prefix="modelbench-tls-") as folder:
            own, ca = Path(folder) / "own.pem", Path(folder) / "ca.pem"
            for path, text in ((own, self.key + self.cert), (ca, self.ca)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="ascii") as out:
                    out.write(text)
            yield own, ca


def session_tls() -> tuple[SessionTls, SessionTls]:
    """(the exchange's material, the workers' material), signed by a new CA whose key is
    then dropped. :class:`TlsUnavailable` without the ``cryptography`` package."""
    try:
        # lazily: only a session with an exchange (several nodes) makes certificates
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise TlsUnavailable(
            f"the exchange's TLS needs the cryptography package ({exc}); pip install cryptography"
        ) from None

    now = datetime.datetime.now(datetime.timezone.utc)
    begin, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelbench session CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(name: str, *usage: x509.ObjectIdentifier) -> SessionTls:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(begin)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        return SessionTls(
            ca_cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
            cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode("ascii"),
        )

    return (
        leaf("modelbench-exchange", ExtendedKeyUsageOID.SERVER_AUTH),
        # a worker calls (the exchange, other nodes' servers) and serves (its own server)
        leaf("modelbench-worker", ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH),
    )

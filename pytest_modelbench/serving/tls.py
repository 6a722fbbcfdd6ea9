"""TLS for the session's exchange, from a certificate authority made for one session.

The controller makes a CA when its exchange starts, signs one certificate for the exchange
(server authentication) and one for the session's workers (client authentication), and
forgets the CA's key, so nothing else can ever be signed by it. The workers' material
travels to them over xdist's channel (the ssh connection ``--tx`` already has), never over
the network in clear and never to a file that stays. Both sides then require the other's
certificate from that CA: a client without it is refused before a byte of a call is read,
and a worker sends its bearer token only to the controller, encrypted.

Host names are not checked: a worker reaches the controller at an address found at run time
(``$SSH_CONNECTION``, a host name, ``$MODELBENCH_EXCHANGE_HOST``), and only the controller
holds a key the session's CA certified for server authentication.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

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
    key: str

    def fields(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.cert, "key": self.key}

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> SessionTls:
        return cls(str(fields["ca"]), str(fields["cert"]), str(fields["key"]))

    def server_context(self) -> ssl.SSLContext:
        """The exchange's context: its certificate, and clients must show one of the CA's."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(context)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """A worker's context: the exchange must show the CA's server certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False  # see the module docstring; the chain is verified
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        context.load_verify_locations(cadata=self.ca)
        # the ssl module reads a key only from a file: one in a private directory, gone at once
        with tempfile.TemporaryDirectory(prefix="modelbench-tls-") as folder:
            path = os.path.join(folder, "own.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(self.key + self.cert)
            context.load_cert_chain(path)


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

    def leaf(name: str, usage: x509.ObjectIdentifier) -> SessionTls:
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
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
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
        leaf("modelbench-worker", ExtendedKeyUsageOID.CLIENT_AUTH),
    )

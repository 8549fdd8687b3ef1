"""TLS for `rediss://` and `amqps://` URLs: which certificate authorities a client trusts.

A TLS connection always verifies the server's certificate and its hostname against the system's CAs. A service
whose certificate is signed by a private CA (a self-signed one, cert-manager's, a company's) needs that CA's PEM
bundle too: `MLLESS_REDIS_CA_FILE` / `MLLESS_RABBITMQ_CA_FILE` name it, and it is trusted besides the system's CAs
(as redis-py's `ssl_ca_certs` does). Verification cannot be turned off from here. A CA given for a plain
`redis://` or `amqp://` URL is an error rather than ignored: the user meant the connection to be encrypted.

A certificate the client does not trust is no outage that a retry could wait out, so the transport reports it at
once, in one line naming the URL and what to set.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from mlless.contract import CA_FILE_VARS
from mlless.transport.base import TransportError, redact_url

#: Per protocol a client speaks: the URL scheme that asks for TLS, and the service whose CA bundle it trusts
#: (the key of `mlless.contract.CA_FILE_VARS`).
TLS_SCHEMES = {"redis": "rediss", "amqp": "amqps"}
_SERVICES = {"redis": "redis", "amqp": "rabbitmq"}


@dataclass(frozen=True)
class TrustedCA:
    """A PEM bundle of CAs trusted besides the system's: from a file, or as text (the operator reads it from a
    Secret). `origin` says where it was set, for error messages: an environment variable or a spec field."""

    origin: str
    file: str | None = None
    pem: str | None = None

    def __str__(self) -> str:
        return f"{self.origin}={self.file}" if self.file else self.origin

    def context(self) -> ssl.SSLContext:
        """A client context trusting the system's CAs and these; certificate and hostname verified."""
        context = ssl.create_default_context()
        try:
            context.load_verify_locations(cafile=self.file, cadata=self.pem)
        except FileNotFoundError:
            raise TransportError(f"{self}: no such file") from None
        except ssl.SSLError as exc:
            raise TransportError(f"{self}: not a PEM bundle of CA certificates ({exc.reason or exc})") from None
        except OSError as exc:
            raise TransportError(f"{self}: cannot read it: {exc.strerror}") from None
        return context


def ca_from_env(service: str, environ: Mapping[str, str] = os.environ) -> TrustedCA | None:
    """The CA bundle the environment names for `service` ("redis" or "amqp"), or None for the system's CAs only."""
    var = CA_FILE_VARS[_SERVICES[service]]
    return TrustedCA(var, file=environ[var]) if environ.get(var) else None


def uses_tls(service: str, url: str, ca: TrustedCA | None) -> bool:
    """Whether `url` asks for TLS; a CA given for a plain URL is an error (see the module docstring)."""
    tls = urlsplit(url).scheme == TLS_SCHEMES[service]
    if ca is not None and not tls:
        raise TransportError(f"{ca} is set but {redact_url(url)} does not use TLS: "
                             f"use {TLS_SCHEMES[service]}:// or drop {ca.origin}")
    return tls


def redis_tls_options(url: str, ca: TrustedCA | None) -> dict[str, Any]:
    """Keyword arguments for redis-py's `from_url` with a `rediss://` URL: hostname checks (redis-py before 6.0
    skipped them by default) and the CA bundle, checked up front so that a bad file is reported as such rather
    than as a connection failure."""
    if not uses_tls("redis", url, ca):
        return {}
    if ca is None:
        return {"ssl_check_hostname": True}
    ca.context()
    return {"ssl_check_hostname": True, "ssl_ca_certs": ca.file, "ssl_ca_data": ca.pem}


def untrusted_certificate(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind `exc` (redis-py wraps it in a ConnectionError), if any."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; the bound guards against a cycle
        if seen is None or isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def untrusted_error(service: str, desc: str, error: ssl.SSLCertVerificationError, ca: TrustedCA | None) -> TransportError:
    """One line: which server, why its certificate was refused, and what the client trusted."""
    trusted = f"the system's CAs and {ca}" if ca else f"the system's CAs only; set {CA_FILE_VARS[_SERVICES[service]]} to the CA that signs it"
    return TransportError(f"{service} {desc}: TLS certificate not trusted ({error.verify_message}); trusting {trusted}")

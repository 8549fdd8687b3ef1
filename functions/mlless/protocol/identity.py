"""Per-process identities: who sealed a frame, and who may speak as whom.

Every process of a job has its own Ed25519 key pair. The job's *issuer* (a key pair of its own, held by whoever
starts the job: `mlless train` in its own process, the operator in the job's Secret) certifies each one: the
certificate is the issuer's signature over the identity's signer id and public key. Every process gets its own
private key, its certificate and the issuer's public key, and nothing else (``Identity.text``), so it can verify
any member's frame and seal only as itself.

A sealed frame carries its *badge* (signer id, public key, certificate) before its signature
(``mlless.protocol.sealing``), so a reader needs no roster: a worker that joins later is verified by the
certificate it brings, and a process keeps the badges it has verified (``Verifier``), so each certificate is
checked once (``speaks_for`` says which senders a signer may name). Signer ids are a worker's rank,
``SUPERVISOR``, or ``ANY_WORKER``: the one identity a function
backend's replicas share, since any replica may be invoked as any rank (docs/kubernetes.md, "Security"). It speaks as any
worker and never as the supervisor.

Ed25519 rather than one MAC key per pair of processes: a frame in the store is read by processes that do not exist
when it is written (a snapshot by a joiner, a checkpoint by the next invocation, a final replica by a successor
supervisor), which no per-pair key can serve; benchmarks/exchange.py measures what the signatures cost.
"""
from __future__ import annotations

import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = [
    "ANY_WORKER",
    "BADGE_BYTES",
    "SIGNATURE_BYTES",
    "SUPERVISOR",
    "Identity",
    "Issuer",
    "Verifier",
    "describe",
    "parse_identity",
    "speaks_for",
]

#: The supervisor's signer id (and its sender id in frames).
SUPERVISOR = -1
#: The signer id of an identity every replica of a function backend holds: any worker rank, never the supervisor.
ANY_WORKER = -2

#: What a certificate signs, before the badge's signer id and public key; a signature of one kind is never valid
#: as the other (`mlless.protocol.sealing` signs under its own prefix).
CERTIFICATE_DOMAIN = b"mlless identity v1\0"
SIGNER = struct.Struct("<i")
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
#: signer id, public key, certificate.
BADGE_BYTES = SIGNER.size + PUBLIC_BYTES + SIGNATURE_BYTES
#: Certified badges a verifier keeps; only valid ones enter, so a job with fewer identities never evicts one.
MAX_KNOWN = 4096
_ISSUER_TAG = "issuer"


def speaks_for(signer: int, sender: int) -> bool:
    """Whether an identity with signer id `signer` may write a frame whose sender is `sender`: its own, a function
    worker's any rank's, and the supervisor's any at all. The supervisor is trusted with the whole job (it closes
    the steps and names who is live), and the model it hands workers to start from is a replica frame, which names
    a worker (runtime/supervisor/failover.py)."""
    return signer in (sender, SUPERVISOR) or (signer == ANY_WORKER and sender >= 0)


def describe(signer: int) -> str:
    return {SUPERVISOR: "the supervisor", ANY_WORKER: "a function worker"}.get(signer, f"rank {signer}")


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


class Identity:
    """One process's signing key, with its certificate and the issuer's public key. Its repr never shows the key."""

    __slots__ = ("signer", "key", "badge", "issuer")

    def __init__(self, signer: int, key: Ed25519PrivateKey, certificate: bytes, issuer: bytes) -> None:
        self.signer, self.key, self.issuer = signer, key, issuer
        self.badge = SIGNER.pack(signer) + _raw_public(key) + certificate

    def sign(self, digest: bytes) -> bytes:
        return self.key.sign(digest)

    def text(self) -> str:
        """The form a process is handed (environment or Secret): `SIGNER:KEY:CERTIFICATE:ISSUER`, hex."""
        return ":".join([str(self.signer), _raw_private(self.key).hex(), self.badge[-SIGNATURE_BYTES:].hex(),
                         self.issuer.hex()])

    def __repr__(self) -> str:
        return f"Identity({describe(self.signer)})"


class Issuer:
    """The job's certifying key: whoever starts the job's processes holds it, and none of them does."""

    __slots__ = ("_key", "public")

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self._key = key or Ed25519PrivateKey.generate()
        self.public = _raw_public(self._key)

    def issue(self, signer: int, key: Ed25519PrivateKey | None = None) -> Identity:
        """A fresh identity for `signer` (a rank, SUPERVISOR or ANY_WORKER), with `key` if given."""
        key = key or Ed25519PrivateKey.generate()
        return Identity(signer, key, self._key.sign(CERTIFICATE_DOMAIN + SIGNER.pack(signer) + _raw_public(key)),
                        self.public)

    def text(self) -> str:
        """`issuer:KEY`, hex: for whoever starts processes (the operator's Secret, a test harness's environment)."""
        return f"{_ISSUER_TAG}:{_raw_private(self._key).hex()}"

    def __repr__(self) -> str:
        return "Issuer()"


def _hex(text: str, size: int) -> bytes:
    raw = bytes.fromhex(text)
    if len(raw) != size:
        raise ValueError
    return raw


def parse_identity(text: str) -> Identity | Issuer:
    """The identity (or issuer) of `Identity.text` (`Issuer.text`); ValueError, without the text, if it is not one."""
    fields = text.strip().split(":")
    try:
        if len(fields) == 2 and fields[0] == _ISSUER_TAG:
            return Issuer(Ed25519PrivateKey.from_private_bytes(_hex(fields[1], 32)))
        if len(fields) == 4:
            signer = int(fields[0])
            if signer < ANY_WORKER or signer >= 2**31:
                raise ValueError
            key = Ed25519PrivateKey.from_private_bytes(_hex(fields[1], 32))
            return Identity(signer, key, _hex(fields[2], SIGNATURE_BYTES), _hex(fields[3], PUBLIC_BYTES))
    except ValueError:
        pass
    raise ValueError("not an identity: SIGNER:KEY:CERTIFICATE:ISSUER or issuer:KEY, in hex")


class Verifier:
    """Checks badges against the job's issuer, keeping the ones it has verified."""

    __slots__ = ("_issuer", "_known")

    def __init__(self, issuer: bytes) -> None:
        self._issuer = Ed25519PublicKey.from_public_bytes(issuer)
        self._known: dict[bytes, tuple[int, Ed25519PublicKey]] = {}

    def certified(self, badge: bytes) -> tuple[int, Ed25519PublicKey] | None:
        """(signer id, public key) of `badge` if the issuer certified it; None otherwise."""
        known = self._known.get(badge)
        if known is None:
            head, certificate = badge[:-SIGNATURE_BYTES], badge[-SIGNATURE_BYTES:]
            try:
                self._issuer.verify(certificate, CERTIFICATE_DOMAIN + head)
            except InvalidSignature:
                return None
            known = (SIGNER.unpack_from(head)[0], Ed25519PublicKey.from_public_bytes(head[SIGNER.size:]))
            if len(self._known) < MAX_KNOWN:
                self._known[badge] = known
        return known

"""Sealing: what crosses a process boundary is a *sealed* frame.

A sealed frame is the frame, then ``SEAL_BYTES`` of seal: the writer's badge
(signer id, Ed25519 public key, the job issuer's certificate of the two:
``mlless.protocol.identity``) and the writer's Ed25519 signature over the
SHA-256 of a context string, a zero byte and the frame.  The transports seal
what they write and unseal what they read (``seal`` / ``unseal``), so a frame
that no member of the job wrote (no seal, a badge another issuer certified, a
bad signature, or a valid frame moved to another Redis key: the key name is the
context) never reaches ``decode`` as a frame: ``unseal`` hands back a
``Rejected`` in its place, which ``decode`` (``mlless.protocol.framing``) turns
into a ``FrameError`` with the reason.  A frame that verifies comes back as a
``Verified`` that knows its signer, and ``decode`` rejects it unless its
header's sender is one the signer may speak as
(``mlless.protocol.identity.speaks_for``): a worker cannot pass for another
rank or for the supervisor.  The receiver therefore counts and drops every such
frame on the same path as any malformed frame.

The frame is hashed once with SHA-256 and the 32-byte digest signed, rather than
the frame itself: Ed25519 hashes what it signs with SHA-512 twice (once to
verify), which has no CPU extension, while OpenSSL's SHA-256 runs on the CPU's
SHA extensions.  Signing the digest then adds a fixed cost per frame, and
verifying it another (benchmarks/exchange.py measures both).

A verified seal already proves what the checksum does, so ``decode`` skips the
checksum of a frame that ``unseal`` verified, and a sender that knows its frame
will travel sealed can leave the checksum out (``encode(..., sealed=True)``):
on a worker's update, the two CRC passes cost half as much again as hashing it.
Such a frame decodes only as a ``Verified``, so a frame read from anywhere else
(a file) always has its checksum.
"""
from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature

from mlless.protocol.identity import BADGE_BYTES, SIGNATURE_BYTES, Identity, Verifier, describe

__all__ = ["SEAL_BYTES", "Rejected", "Verified", "seal", "unseal"]

#: Bytes of the seal after a frame: the badge, then the signature.
SEAL_BYTES = BADGE_BYTES + SIGNATURE_BYTES
#: What a seal's signature signs, before the digest; never valid as a certificate (`identity.CERTIFICATE_DOMAIN`).
SEAL_DOMAIN = b"mlless seal v1\0"


class Rejected(bytes):
    """Stands in for a value or message whose seal did not verify: empty bytes, so nothing can be read from it, and
    ``decode`` raises ``FrameError(reason)`` for it.  It never leaves the process that made it."""

    reason: str

    def __new__(cls, reason: str) -> "Rejected":
        obj = super().__new__(cls)
        obj.reason = reason
        return obj


class Verified(bytes):
    """A frame whose seal ``unseal`` verified: the member ``signer`` wrote it and no bit of it changed on the way,
    so ``decode`` need not check its checksum, only that the signer may speak as the frame's sender."""

    signer: int

    def __new__(cls, frame: bytes | memoryview, signer: int) -> "Verified":
        obj = super().__new__(cls, frame)
        obj.signer = signer
        return obj


def _digest(context: str, frame: bytes | memoryview) -> bytes:
    h = hashlib.sha256(SEAL_DOMAIN + context.encode("utf-8") + b"\0")
    h.update(frame)
    return h.digest()


def seal(frame: bytes, identity: Identity, context: str) -> bytes:
    """``frame`` followed by its seal by ``identity``; ``context`` (a Redis key's name, or the message channel) is
    signed with it, so the frame is valid nowhere else."""
    return b"".join([frame, identity.badge, identity.sign(_digest(context, frame))])


def unseal(sealed: bytes, verifier: Verifier, context: str) -> Verified | Rejected:
    """The frame inside ``sealed`` as a ``Verified`` if its badge is certified by the job's issuer and its signature
    verifies under ``context``; otherwise a ``Rejected``."""
    view = memoryview(sealed)
    certified = verifier.certified(bytes(view[-SEAL_BYTES:-SIGNATURE_BYTES])) if len(view) >= SEAL_BYTES else None
    if certified is None:
        return Rejected(f"{context}: bad or missing seal: not written by a member of this job")
    signer, public = certified
    frame = view[:-SEAL_BYTES]
    try:
        public.verify(bytes(view[-SIGNATURE_BYTES:]), _digest(context, frame))
    except InvalidSignature:
        return Rejected(f"{context}: bad signature: not written by {describe(signer)} of this job, or changed since")
    return Verified(frame, signer)

"""The transport contract shared by the services backend and the embedded broker.

A job's processes (one supervisor, P workers) need two things from the outside
world: a key-value store for bulk bytes (updates, replicas, checkpoints: the
Redis role) and per-process queues for small control frames (the RabbitMQ
role).  The protocol code is written once against ``Transport`` and runs
unchanged on a cluster (``ServicesTransport``) or on a laptop
(``EmbeddedTransport``).

Every key and queue is namespaced by job id, so two jobs sharing one Redis or
RabbitMQ never see each other's data, and ``delete_job`` removes exactly one
job.  Every write carries a TTL so a crashed job cannot leak.

Every value and message is sealed with the process's own identity on the way
out and unsealed on the way in (``mlless.protocol.sealing.seal``), here rather
than in the protocol code, so no write can skip it.  A value or message whose
seal does not verify, or a value under a key its signer may not write
(``mlless.protocol.keys.may_write``: a worker writes only its own rank's keys),
comes back as a ``sealing.Rejected``, which ``decode`` rejects with the reason:
the receiver counts it where it counts any malformed frame.  A transport cannot
be opened without an identity; ``connect`` reads it from the environment
(``mlless.transport.credentials.identity``).  The one exception is ``run_script``: what
a script in Redis writes and returns cannot carry a signature, so its caller
authenticates it with a key derived for the purpose from what every member of
the job holds (``subkey``; ``mlless.sync.exchanges.instore``).
"""
from __future__ import annotations

import hmac
import re
from abc import ABC, abstractmethod
from typing import Any, Literal, Sequence
from urllib.parse import urlsplit, urlunsplit

from mlless.protocol import keys
from mlless.protocol.identity import ANY_WORKER, SUPERVISOR, Identity, Issuer, Verifier, describe, speaks_for
from mlless.protocol.sealing import Rejected, seal, unseal

__all__ = [
    "Role",
    "DEFAULT_TTL",
    "SUPERVISOR",
    "ANY_WORKER",
    "Transport",
    "TransportError",
    "UnroutableError",
    "redact_url",
    "check_job_id",
    "check_key",
    "key_prefix",
    "check_identity",
    "MESSAGE_CONTEXT",
    "value_context",
]

Role = Literal["supervisor", "worker"]
#: Default lifetime of every key written by a job (seconds).
DEFAULT_TTL = 24 * 3600
#: What a message's MAC is bound to besides the frame (a value's: `value_context`).
MESSAGE_CONTEXT = "message"

_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MAX_KEY = 512


class TransportError(RuntimeError):
    """The backend failed or refused an operation (the message never contains a password)."""


class UnroutableError(TransportError):
    """A message was sent to a queue that does not exist (the recipient has not connected, or left)."""


def redact_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to log)."""
    if not url:
        return str(url)
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        user = parts.username or ""
        return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
    except ValueError:
        # Unparseable: hide everything between the scheme and the last '@'.
        return re.sub(r"//[^/]*@", "//***@", url)


def check_job_id(job_id: str) -> str:
    """Job ids are restricted so they are safe inside key globs and queue names."""
    if not isinstance(job_id, str) or not _JOB_RE.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}: use 1-128 of [A-Za-z0-9_.-], starting alphanumeric")
    return job_id


def check_key(key: str) -> str:
    if (
        not isinstance(key, str)
        or not key
        or key.startswith("_")
        or len(key) > _MAX_KEY
        or any(c in key for c in "*?[]\\ \n\r\t")
    ):
        raise ValueError(
            f"invalid key {key!r}: 1-{_MAX_KEY} chars, no whitespace or glob characters, "
            "not starting with '_' (reserved for the transport)"
        )
    return key


def check_identity(identity: Identity | Issuer, rank: int) -> Identity:
    """The identity a transport for queue id `rank` seals with: `identity`, if it may speak as `rank`, or one the
    issuer `identity` makes for it (a harness that plays several processes). TransportError otherwise, in one line
    (never showing it)."""
    if isinstance(identity, Issuer):
        return identity.issue(rank)
    if not isinstance(identity, Identity):
        raise TransportError("a transport needs an Identity (mlless.protocol.identity)")
    if not speaks_for(identity.signer, rank):
        raise TransportError(f"the identity of {describe(identity.signer)} cannot speak as {describe(rank)}")
    return identity


def value_context(key: str) -> str:
    """What the MAC of the value under `key` is bound to besides the frame: a value is valid under its key only."""
    return f"value {key}"


def key_prefix(job_id: str) -> str:
    """All keys of a job start with this."""
    return f"mlless:{job_id}:"


class Transport(ABC):
    """One per process.  Not thread-safe: use it from the thread that created it.

    Messages are opaque ``bytes`` (``mlless.protocol.framing`` frames); values are opaque
    ``bytes``.  Receipt counts as handling: ``receive`` acknowledges a message
    as it returns it.
    """

    job_id: str
    role: Role
    rank: int  # SUPERVISOR (-1) for the supervisor
    ttl: int
    #: When (monotonic) the transport last reconnected after an outage: the time before it heard nothing, through
    #: no fault of the other side.
    reconnected_at: float = -float("inf")
    #: How many times the key-value store was found to have lost the job's keys (a Redis restarted without
    #: persistence); a process that sees it grow publishes again what its peers may still read.
    store_epoch: int = 0
    #: How many key-value store instances the job pays for (its Redis shards, `mlless.transport.shards`).
    store_instances: int = 1
    #: This process's identity (`check_identity`) and the verifier of its peers'; a backend sets them before its
    #: first write, and never shows them.
    _identity: Identity
    _verifier: Verifier

    def _identify(self, job_id: str, role: Role, rank: int | None, identity: Identity | Issuer, ttl: int) -> None:
        """Check and set who this transport is: its job, role and queue id (`check_role`), its identity, and the
        lifetime of what it writes; every backend's constructor starts with it."""
        self.job_id = check_job_id(job_id)
        self.role = role
        self.rank = check_role(role, rank)
        self._identity = check_identity(identity, self.rank)
        self._verifier = Verifier(self._identity.issuer)
        if ttl <= 0:
            raise ValueError("ttl must be > 0 seconds")
        self.ttl = int(ttl)

    # ---------------------------------------------------------------- sealing, for the backends
    def _seal_value(self, key: str, value: bytes) -> bytes:
        return seal(check_body(value), self._identity, value_context(key))

    def _unseal_value(self, key: str, value: bytes | None) -> bytes | None:
        if value is None:
            return None
        found = unseal(value, self._verifier, value_context(key))
        if isinstance(found, Rejected) or keys.may_write(found.signer, key):
            return found
        return Rejected(f"{value_context(key)}: sealed by {describe(found.signer)}, which may not write it: forged")

    def _seal_message(self, body: bytes) -> bytes:
        return seal(check_body(body), self._identity, MESSAGE_CONTEXT)

    def _unseal_message(self, body: bytes | None) -> bytes | None:
        return None if body is None else unseal(body, self._verifier, MESSAGE_CONTEXT)

    def subkey(self, purpose: str) -> bytes:
        """A key for `purpose` that every member of the job derives alike (HMAC-SHA256 of the purpose under the
        issuer's public key, which only the job's identities carry: no frame shows it), for a MAC that a party
        without an identity must check: a script in Redis (sync/exchanges/instore.py). Any member can compute it, so
        such a MAC tells a member's write from an outsider's, not one member's from another's."""
        return hmac.new(self._identity.issuer, f"subkey {purpose}".encode("utf-8"), "sha256").digest()

    # ---------------------------------------------------------------- key-value
    @abstractmethod
    def put(self, key: str, value: bytes, ttl: int | None = None) -> None:
        """Store ``value`` under the job-namespaced ``key`` for ``ttl`` seconds (default: the transport's TTL)."""

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Fetch several values in one round trip; ``None`` for a missing key."""

    @abstractmethod
    def delete_job(self) -> int:
        """Delete every key, queue and exchange of this job; return the number of keys deleted."""

    def run_script(self, source: str, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        """Run the Lua `source` inside the key-value store over the job-namespaced `keys`, and return its reply.
        Neither the arguments nor the reply are sealed: the caller authenticates what the script makes
        (sync/exchanges/instore.py). TransportError if the store runs no scripts."""
        raise TransportError(f"{type(self).__name__} runs no scripts in its store: that needs Redis")

    def probe_store(self) -> None:
        """Look whether the key-value store has lost the job's keys (`store_epoch`), between other calls, which look
        on their own. The embedded broker's store can only go with everything else, so it has nothing to look at."""

    @abstractmethod
    def reset(self) -> None:
        """Delete the job's keys and empty its queues, which stay, with whoever consumes them: a successor
        supervisor starts on a clean slate, with nothing its predecessor's run left, while that run's workers
        can still hear from it."""

    # ---------------------------------------------------------------- messages
    @abstractmethod
    def send_to_supervisor(self, body: bytes) -> None:
        """Queue ``body`` for the supervisor; ``UnroutableError`` if its queue does not exist."""

    def post_to_supervisor(self, body: bytes) -> None:
        """`send_to_supervisor` for a message nobody waits on the sending side (a step's report): a transport
        may return before the broker has answered, and report a failure at the next call instead."""
        self.send_to_supervisor(body)

    def post_many_to_supervisor(self, bodies: Sequence[bytes]) -> None:
        """`post_to_supervisor` for several messages, in order; a transport may write them at once."""
        for body in bodies:
            self.post_to_supervisor(body)

    @abstractmethod
    def broadcast(self, body: bytes) -> None:
        """Queue ``body`` for every worker whose queue exists now (later joiners don't get it)."""

    @abstractmethod
    def receive(self, timeout: float | None) -> bytes | None:
        """Next message of this process's own queue, acknowledged; ``None`` after ``timeout`` seconds.

        ``timeout=None`` blocks until a message arrives; ``0`` polls.
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections.  The process's queue stays: a re-invoked worker finds what was sent meanwhile."""


def check_role(role: str, rank: int | None) -> int:
    """Validate (role, rank) and return the queue id: SUPERVISOR or the worker's rank."""
    if role == "supervisor":
        if rank not in (None, SUPERVISOR):
            raise ValueError("the supervisor has no rank")
        return SUPERVISOR
    if role == "worker":
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
            raise ValueError(f"a worker needs a rank >= 0, got {rank!r}")
        return rank
    raise ValueError(f"role must be 'supervisor' or 'worker', got {role!r}")


def check_body(body: bytes) -> bytes:
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"message body must be bytes, got {type(body).__name__}")
    return bytes(body)

"""``EmbeddedTransport``: a job's process talking to an ``EmbeddedBroker`` (``mlless.transport.embedded_broker``).

Workers are separate processes and the supervisor a client like them, so a
laptop run exercises the same transport contract as a cluster run.  The
request format is the broker's; see its module docstring.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Sequence

from mlless.protocol.framing import U8, U16, U32, FrameError, Reader, pack_blob, pack_text
from mlless.protocol.identity import Identity, Issuer

from .base import (
    DEFAULT_TTL,
    SUPERVISOR,
    Role,
    Transport,
    TransportError,
    UnroutableError,
    check_key,
)
from .embedded_broker import (
    I32,
    LEN,
    MAX_WAIT,
    OP_BROADCAST,
    OP_DECLARE,
    OP_DELETE_JOB,
    OP_GET_MANY,
    OP_PUT_MANY,
    OP_RECEIVE,
    OP_SEND,
    ST_OK,
    ST_UNROUTABLE,
    U64,
    recv_exact,
)

__all__ = ["EmbeddedTransport"]


def _connect_socket(address: str, timeout: float) -> socket.socket:
    if not address.startswith("unix:"):
        raise ValueError(f"embedded broker address must start with 'unix:', got {address!r}")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(address[len("unix:") :])
    except OSError as exc:
        s.close()
        raise TransportError(f"cannot reach embedded broker at {address}: {exc}") from None
    return s


class EmbeddedTransport(Transport):
    """Client of an ``EmbeddedBroker``; used by workers (separate processes) and the supervisor."""

    def __init__(
        self,
        address: str,
        job_id: str,
        *,
        role: Role,
        rank: int | None = None,
        identity: Identity | Issuer,
        ttl: int = DEFAULT_TTL,
        timeout: float = 30.0,
    ) -> None:
        self._identify(job_id, role, rank, identity, ttl)
        self.address = address
        self._timeout = timeout
        self._job = pack_text(job_id, U16)
        self._lock = threading.Lock()
        self._posted = 0  # requests sent whose answers are still unread (post_to_supervisor)
        self._sock: socket.socket | None = _connect_socket(address, timeout)
        self._call(OP_DECLARE, I32.pack(self.rank))  # synchronous: broadcasts reach us from now on

    # ------------------------------------------------------------------ plumbing
    def _call(self, op: int, *fields: bytes, post: bool = False) -> tuple[int, bytes]:
        """One request per `fields`, written at once, and the last one's answer; with ``post``, every answer is
        left for the next call to read and check."""
        bodies = [U8.pack(op) + self._job + f for f in fields]
        with self._lock:
            s = self._sock
            if s is None:
                raise TransportError("transport is closed")
            try:
                s.sendall(b"".join(LEN.pack(len(body)) + body for body in bodies))
                self._posted += len(bodies) if post else len(bodies) - 1
                if post:
                    return ST_OK, b""
                # Answers come in request order: the posted ones first. All are read before any is judged.
                posted = [self._read_answer(s) for _ in range(self._posted)]
                self._posted = 0
                resp = self._read_answer(s)
            except (OSError, ConnectionError) as exc:
                self._sock = None
                s.close()
                raise TransportError(f"embedded broker {self.address}: {exc}") from None
        for answer in posted:
            self._check(answer)
        return self._check(resp)

    @staticmethod
    def _read_answer(s: socket.socket) -> bytes:
        head = recv_exact(s, 4)
        if head is None:
            raise ConnectionError("broker closed the connection")
        (n,) = LEN.unpack(head)
        return (recv_exact(s, n) if n else b"") or b""

    @staticmethod
    def _check(resp: bytes) -> tuple[int, bytes]:
        if not resp:
            raise TransportError("empty response from embedded broker")
        status, payload = resp[0], resp[1:]
        if status == ST_OK:
            return status, payload
        text = payload.decode("utf-8", errors="replace")
        if status == ST_UNROUTABLE:
            raise UnroutableError(text)
        raise TransportError(f"embedded broker: {text}")

    # ------------------------------------------------------------------ key-value
    def put(self, key: str, value: bytes, ttl: int | None = None) -> None:
        ttl_ms = U64.pack(int(ttl or self.ttl) * 1000)
        item = pack_text(check_key(key), U16) + pack_blob(self._seal_value(key, value), U32)
        self._call(OP_PUT_MANY, ttl_ms + U32.pack(1) + item)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        fields = U32.pack(len(keys)) + b"".join(pack_text(check_key(k), U16) for k in keys)
        _, payload = self._call(OP_GET_MANY, fields)
        r = Reader(payload)
        try:
            (count,) = r.unpack(U32)
            if count != len(keys):
                raise FrameError("response count mismatch")
            out = [r.blob(U32) if r.unpack(U8)[0] else None for _ in range(count)]
            r.end()
        except FrameError as exc:
            raise TransportError(f"bad response from embedded broker: {exc}") from None
        return [self._unseal_value(k, v) for k, v in zip(keys, out)]

    def delete_job(self) -> int:
        _, payload = self._call(OP_DELETE_JOB, b"")
        return U64.unpack(payload)[0]

    def reset(self) -> None:
        # Every queue goes, not only their messages: no worker outlives the process that hosts the broker.
        self.delete_job()
        self._call(OP_DECLARE, I32.pack(self.rank))

    # ------------------------------------------------------------------ messages
    def send_to_supervisor(self, body: bytes) -> None:
        self._call(OP_SEND, I32.pack(SUPERVISOR) + pack_blob(self._seal_message(body), U32))

    def post_to_supervisor(self, body: bytes) -> None:
        self.post_many_to_supervisor([body])

    def post_many_to_supervisor(self, bodies: Sequence[bytes]) -> None:
        # The answers are read, and any error raised, by the next call: a report's round trip is off the step.
        to = I32.pack(SUPERVISOR)
        self._call(OP_SEND, *(to + pack_blob(self._seal_message(body), U32) for body in bodies), post=True)

    def broadcast(self, body: bytes) -> None:
        self._call(OP_BROADCAST, pack_blob(self._seal_message(body), U32))

    def receive(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = MAX_WAIT if deadline is None else max(0.0, min(deadline - time.monotonic(), MAX_WAIT))
            _, payload = self._call(OP_RECEIVE, I32.pack(self.rank) + U32.pack(int(left * 1000)))
            if payload[:1] == b"\x01":
                return self._unseal_message(payload[1:])
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        with self._lock:
            s, self._sock = self._sock, None
        if s is not None:
            s.close()

    def __repr__(self) -> str:
        return f"EmbeddedTransport(job={self.job_id!r}, role={self.role}, rank={self.rank}, address={self.address})"

"""An embedded broker for laptops: Redis-like KV + RabbitMQ-like queues in one small server.

``mlless train job.yaml`` must work with nothing installed but the package, yet
the workers are real OS processes, so they need *some* broker.  The supervisor
starts an ``EmbeddedBroker`` in a background thread, hands ``broker.address``
to the workers (e.g. in an environment variable), and everybody, the
supervisor included, talks to it through ``EmbeddedTransport``.  The protocol
code therefore runs exactly as it does over Redis and RabbitMQ.

Wire protocol (no pickle; every request is validated, and a malformed one gets
an error response and is counted in ``broker.malformed``, never crashes the
server).  Both directions are length-prefixed::

    request  = u32 length | u8 op | op fields
    response = u32 length | u8 status | payload

Strings are ``u16 length + utf-8``; blobs are ``u32 length + bytes``; the job id
is the first field of every op except PING.  Queues are identified by rank:
-1 is the supervisor, >= 0 a worker; worker queues are implicitly bound to the
job's fanout.

Blocking receive waits on a per-queue condition variable server-side (no
busy-spin).  Clients ask for at most ``_MAX_WAIT`` seconds per request and loop,
and the server checks the client is still connected before handing a message
out, so a killed client cannot swallow a message meant for its successor.
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from typing import Mapping, Sequence

from .base import (
    DEFAULT_TTL,
    SUPERVISOR,
    Role,
    Transport,
    TransportError,
    UnroutableError,
    check_body,
    check_job_id,
    check_key,
    check_role,
)

__all__ = ["EmbeddedBroker", "EmbeddedTransport", "ProtocolError"]

log = logging.getLogger(__name__)

# ops
OP_PING, OP_PUT_MANY, OP_GET_MANY, OP_TTL, OP_DELETE_JOB = 0, 1, 2, 3, 4
OP_DECLARE, OP_SEND, OP_BROADCAST, OP_RECEIVE, OP_DELETE_QUEUE = 5, 6, 7, 8, 9
# statuses
ST_OK, ST_ERROR, ST_UNROUTABLE, ST_NO_QUEUE = 0, 1, 2, 3

_LEN = struct.Struct("<I")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")

#: Longest a single RECEIVE request blocks server-side; clients loop for longer waits.
_MAX_WAIT = 1.0
DEFAULT_MAX_REQUEST = 1 << 30


class ProtocolError(ValueError):
    """A request or response does not follow the embedded broker protocol."""


# --------------------------------------------------------------------------- codec


class _Buf:
    """Bounds-checked reader over one request/response body."""

    __slots__ = ("b", "p")

    def __init__(self, b: bytes) -> None:
        self.b, self.p = b, 0

    def take(self, n: int) -> bytes:
        if self.p + n > len(self.b):
            raise ProtocolError(f"truncated: need {n} bytes at {self.p} of {len(self.b)}")
        out = self.b[self.p : self.p + n]
        self.p += n
        return out

    def u(self, st: struct.Struct) -> int | float:
        return st.unpack(self.take(st.size))[0]

    def str_(self) -> str:
        n = int(self.u(_U16))
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("string is not utf-8") from None

    def blob(self) -> bytes:
        return self.take(int(self.u(_U32)))

    def end(self) -> None:
        if self.p != len(self.b):
            raise ProtocolError(f"{len(self.b) - self.p} trailing bytes")


def _s(x: str) -> bytes:
    b = x.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ProtocolError("string too long")
    return _U16.pack(len(b)) + b


def _blob(x: bytes) -> bytes:
    return _U32.pack(len(x)) + x


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Read exactly n bytes; None on a clean EOF before the first byte."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("peer closed mid-message")
        got += k
    return bytes(buf)


# --------------------------------------------------------------------------- server


class _Queue:
    __slots__ = ("items", "cv")

    def __init__(self, lock: threading.Lock) -> None:
        self.items: collections.deque[bytes] = collections.deque()
        self.cv = threading.Condition(lock)


class EmbeddedBroker:
    """In-process broker server: KV with TTL, per-rank queues, fanout, delete-job.

    Listens on a Unix domain socket (default: a fresh temp dir) or, with
    ``tcp=True``, on 127.0.0.1 with an ephemeral port.  One thread per client
    connection; all state sits behind one lock, with one condition variable per
    queue so a send wakes only that queue's receiver.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        tcp: bool = False,
        max_request: int = DEFAULT_MAX_REQUEST,
        sweep_interval: float = 5.0,
        start: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._kv: dict[tuple[str, str], tuple[bytes, float]] = {}
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._max_request = max_request
        self._sweep_interval = sweep_interval
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._tmpdir: str | None = None
        self.malformed = 0  #: requests rejected as malformed (a metric for the supervisor)
        self.requests = 0

        if tcp:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", 0))
            host, port = self._sock.getsockname()
            self.address = f"tcp:{host}:{port}"
            self._path: str | None = None
        else:
            if path is None:
                self._tmpdir = tempfile.mkdtemp(prefix="mlless-broker-")
                path = os.path.join(self._tmpdir, "broker.sock")
            self._path = path
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.bind(path)
            os.chmod(path, 0o600)  # only this user's processes may join the job
            self.address = f"unix:{path}"
        self._sock.listen(128)  # clients may connect from here on; they are served once started
        self._sock.settimeout(0.5)
        self._started = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def _start_thread(self, target, name: str, *args: object) -> threading.Thread:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def start(self) -> "EmbeddedBroker":
        """Start serving in background threads (idempotent; the constructor does it unless ``start=False``)."""
        if self._stopping.is_set():
            raise RuntimeError("broker was stopped")
        if not self._started:
            self._started = True
            self._start_thread(self._accept_loop, "mlless-broker-accept")
            self._start_thread(self._sweep_loop, "mlless-broker-sweep")
        return self

    def stop(self) -> None:
        """Stop serving, wake every blocked receiver, close connections, remove the socket file."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            for q in self._queues.values():
                q.cv.notify_all()
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._sock.close()
        except OSError:
            pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            conn.settimeout(None)
            if conn.family == socket.AF_INET:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
                self._threads = [t for t in self._threads if t.is_alive()]
            self._start_thread(self._serve, "mlless-broker-conn", conn)

    def _sweep_loop(self) -> None:
        """Expire keys in the background so an idle crashed job's data does not linger."""
        while not self._stopping.wait(self._sweep_interval):
            now = time.monotonic()
            with self._lock:
                dead = [k for k, (_, exp) in self._kv.items() if exp <= now]
                for k in dead:
                    del self._kv[k]

    # ------------------------------------------------------------------ connection
    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self._stopping.is_set():
                head = _recv_exact(conn, 4)
                if head is None:
                    return
                (n,) = _LEN.unpack(head)
                if n == 0 or n > self._max_request:
                    self._count_malformed(f"request length {n} out of range")
                    # The stream cannot be resynchronised: answer, then hang up.
                    self._reply(conn, ST_ERROR, f"request length {n} out of range".encode())
                    return
                body = _recv_exact(conn, n)
                if body is None:
                    return
                with self._lock:
                    self.requests += 1
                try:
                    status, payload = self._handle(conn, body)
                except ProtocolError as exc:
                    self._count_malformed(str(exc))
                    status, payload = ST_ERROR, f"malformed request: {exc}".encode()
                except Exception as exc:  # a bug must not take the broker down
                    log.exception("embedded broker: internal error")
                    status, payload = ST_ERROR, f"internal error: {type(exc).__name__}".encode()
                self._reply(conn, status, payload)
        except (ConnectionError, OSError):
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _count_malformed(self, why: str) -> None:
        with self._lock:
            self.malformed += 1
        log.warning("embedded broker: rejected malformed request: %s", why)

    @staticmethod
    def _reply(conn: socket.socket, status: int, payload: bytes) -> None:
        conn.sendall(_LEN.pack(1 + len(payload)) + _U8.pack(status) + payload)

    # ------------------------------------------------------------------ operations
    def _handle(self, conn: socket.socket, body: bytes) -> tuple[int, bytes]:
        b = _Buf(body)
        op = int(b.u(_U8))
        if op == OP_PING:
            b.end()
            return ST_OK, b""
        job = b.str_()
        try:
            check_job_id(job)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None

        if op == OP_PUT_MANY:
            ttl_ms = int(b.u(_U64))
            count = int(b.u(_U32))
            if ttl_ms == 0:
                raise ProtocolError("ttl must be > 0")
            items = []
            for _ in range(count):
                items.append((self._key(b.str_()), b.blob()))
            b.end()
            exp = time.monotonic() + ttl_ms / 1000.0
            with self._lock:
                for k, v in items:
                    self._kv[(job, k)] = (v, exp)
            return ST_OK, b""

        if op == OP_GET_MANY:
            count = int(b.u(_U32))
            keys = [self._key(b.str_()) for _ in range(count)]
            b.end()
            now = time.monotonic()
            parts = [_U32.pack(count)]
            with self._lock:
                for k in keys:
                    hit = self._kv.get((job, k))
                    if hit is None or hit[1] <= now:
                        parts.append(b"\x00")
                    else:
                        parts.append(b"\x01" + _blob(hit[0]))
            return ST_OK, b"".join(parts)

        if op == OP_TTL:
            k = self._key(b.str_())
            b.end()
            with self._lock:
                hit = self._kv.get((job, k))
            left = None if hit is None else hit[1] - time.monotonic()
            if left is None or left <= 0:
                return ST_OK, b"\x00"
            return ST_OK, b"\x01" + _F64.pack(left)

        if op == OP_DELETE_JOB:
            b.end()
            with self._lock:
                keys = [k for k in self._kv if k[0] == job]
                for k in keys:
                    del self._kv[k]
                for qk in [qk for qk in self._queues if qk[0] == job]:
                    self._queues.pop(qk).cv.notify_all()
            return ST_OK, _U64.pack(len(keys))

        if op in (OP_DECLARE, OP_DELETE_QUEUE):
            rank = self._rank(b)
            b.end()
            with self._lock:
                if op == OP_DECLARE:
                    self._queues.setdefault((job, rank), _Queue(self._lock))
                else:
                    q = self._queues.pop((job, rank), None)
                    if q is not None:
                        q.cv.notify_all()
            return ST_OK, b""

        if op == OP_SEND:
            rank = self._rank(b)
            msg = b.blob()
            b.end()
            with self._lock:
                q = self._queues.get((job, rank))
                if q is None:
                    return ST_UNROUTABLE, f"no queue for rank {rank} in job {job}".encode()
                q.items.append(msg)
                q.cv.notify()
            return ST_OK, b""

        if op == OP_BROADCAST:
            msg = b.blob()
            b.end()
            with self._lock:
                for (j, r), q in self._queues.items():
                    if j == job and r >= 0:
                        q.items.append(msg)
                        q.cv.notify()
            return ST_OK, b""

        if op == OP_RECEIVE:
            rank = self._rank(b)
            timeout_ms = int(b.u(_U32))
            b.end()
            return self._receive(conn, job, rank, min(timeout_ms / 1000.0, _MAX_WAIT))

        raise ProtocolError(f"unknown op {op}")

    def _receive(self, conn: socket.socket, job: str, rank: int, timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        with self._lock:
            q = self._queues.get((job, rank))
            if q is None:
                return ST_NO_QUEUE, f"no queue for rank {rank} in job {job}".encode()
            while not q.items:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    return ST_OK, b"\x00"
                q.cv.wait(left)
                if self._queues.get((job, rank)) is not q:
                    return ST_NO_QUEUE, f"queue for rank {rank} in job {job} was deleted".encode()
            if not _alive(conn):
                return ST_OK, b"\x00"  # the asker is gone; leave the message for its successor
            return ST_OK, b"\x01" + q.items.popleft()

    @staticmethod
    def _key(key: str) -> str:
        try:
            return check_key(key)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None

    @staticmethod
    def _rank(b: _Buf) -> int:
        rank = int(b.u(_I32))
        if rank < SUPERVISOR:
            raise ProtocolError(f"invalid queue rank {rank}")
        return rank


def _alive(conn: socket.socket) -> bool:
    """True unless the peer has closed its end (a pending EOF is visible with MSG_PEEK)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- client


def _connect_socket(address: str, timeout: float) -> socket.socket:
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = address[len("unix:") :]
    elif address.startswith("tcp:"):
        host, _, port = address[len("tcp:") :].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad embedded broker address {address!r}")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = (host, int(port))
    else:
        raise ValueError(f"embedded broker address must start with 'unix:' or 'tcp:', got {address!r}")
    s.settimeout(timeout)
    try:
        s.connect(target)  # type: ignore[arg-type]
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
        ttl: int = DEFAULT_TTL,
        timeout: float = 30.0,
    ) -> None:
        self.job_id = check_job_id(job_id)
        self.role = role
        self.rank = check_role(role, rank)
        if ttl <= 0:
            raise ValueError("ttl must be > 0 seconds")
        self.ttl = int(ttl)
        self.address = address
        self._timeout = timeout
        self._job = _s(job_id)
        self._lock = threading.Lock()
        self._posted = 0  # requests sent whose answers are still unread (post_to_supervisor)
        self._sock: socket.socket | None = _connect_socket(address, timeout)
        self._call(OP_DECLARE, _I32.pack(self.rank))  # synchronous: broadcasts reach us from now on

    # ------------------------------------------------------------------ plumbing
    def _call(self, op: int, fields: bytes, *, with_job: bool = True, post: bool = False) -> tuple[int, bytes]:
        """One request and its answer; with ``post``, the answer is left for the next call to read and check."""
        body = _U8.pack(op) + (self._job if with_job else b"") + fields
        with self._lock:
            s = self._sock
            if s is None:
                raise TransportError("transport is closed")
            try:
                s.sendall(_LEN.pack(len(body)) + body)
                if post:
                    self._posted += 1
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
        head = _recv_exact(s, 4)
        if head is None:
            raise ConnectionError("broker closed the connection")
        (n,) = _LEN.unpack(head)
        return (_recv_exact(s, n) if n else b"") or b""

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
        self._put({key: value}, int(ttl or self.ttl))

    def put_many(self, items: Mapping[str, bytes]) -> None:
        self._put(items, self.ttl)

    def _put(self, items: Mapping[str, bytes], ttl: int) -> None:
        if not items:
            return
        parts = [_U64.pack(ttl * 1000), _U32.pack(len(items))]
        for k, v in items.items():
            parts.append(_s(check_key(k)))
            parts.append(_blob(check_body(v)))
        self._call(OP_PUT_MANY, b"".join(parts))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        fields = _U32.pack(len(keys)) + b"".join(_s(check_key(k)) for k in keys)
        _, payload = self._call(OP_GET_MANY, fields)
        b = _Buf(payload)
        try:
            count = int(b.u(_U32))
            if count != len(keys):
                raise ProtocolError("response count mismatch")
            out: list[bytes | None] = []
            for _ in range(count):
                out.append(b.blob() if int(b.u(_U8)) else None)
            b.end()
        except ProtocolError as exc:
            raise TransportError(f"bad response from embedded broker: {exc}") from None
        return out

    def ttl_of(self, key: str) -> float | None:
        _, payload = self._call(OP_TTL, _s(check_key(key)))
        if payload[:1] != b"\x01":
            return None
        return _F64.unpack(payload[1:9])[0]

    def delete_job(self) -> int:
        _, payload = self._call(OP_DELETE_JOB, b"")
        return _U64.unpack(payload)[0]

    # ------------------------------------------------------------------ messages
    def send_to_supervisor(self, body: bytes) -> None:
        self._call(OP_SEND, _I32.pack(SUPERVISOR) + _blob(check_body(body)))

    def post_to_supervisor(self, body: bytes) -> None:
        # The answer is read, and any error raised, by the next call: a report's round trip is off the step.
        self._call(OP_SEND, _I32.pack(SUPERVISOR) + _blob(check_body(body)), post=True)

    def send_to_worker(self, rank: int, body: bytes) -> None:
        self._call(OP_SEND, _I32.pack(self._check_rank(rank)) + _blob(check_body(body)))

    def broadcast(self, body: bytes) -> None:
        self._call(OP_BROADCAST, _blob(check_body(body)))

    def receive(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = _MAX_WAIT if deadline is None else max(0.0, min(deadline - time.monotonic(), _MAX_WAIT))
            _, payload = self._call(OP_RECEIVE, _I32.pack(self.rank) + _U32.pack(int(left * 1000)))
            if payload[:1] == b"\x01":
                return payload[1:]
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def close(self, *, delete_queue: bool = False) -> None:
        if self._sock is None:
            return
        try:
            if delete_queue:
                self._call(OP_DELETE_QUEUE, _I32.pack(self.rank))
        finally:
            with self._lock:
                s, self._sock = self._sock, None
            if s is not None:
                s.close()

    def __repr__(self) -> str:
        return f"EmbeddedTransport(job={self.job_id!r}, role={self.role}, rank={self.rank}, address={self.address})"

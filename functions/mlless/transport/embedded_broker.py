"""An embedded broker for laptops: Redis-like KV + RabbitMQ-like queues in one small server.

``mlless train job.yaml`` must work with nothing installed but the package, yet
the workers are real OS processes, so they need *some* broker.  The supervisor
starts an ``EmbeddedBroker`` in a background thread, hands ``broker.address``
to the workers (e.g. in an environment variable), and everybody, the
supervisor included, talks to it through ``EmbeddedTransport``
(``mlless.transport.embedded``).  The protocol code therefore runs exactly as
it does over Redis and RabbitMQ.

Wire protocol (no pickle; every request is validated, and a malformed one gets
an error response and is counted in ``broker.malformed``, never crashes the
server).  Both directions are length-prefixed::

    request  = u32 length | u8 op | op fields
    response = u32 length | u8 status | payload

Strings are ``u16 length + utf-8``; blobs are ``u32 length + bytes`` (the
framing's ``pack_text`` / ``pack_blob``, read back with its ``Reader``); the job id
is the first field of every op except PING.  Queues are identified by rank:
-1 is the supervisor, >= 0 a worker; worker queues are implicitly bound to the
job's fanout.

Blocking receive waits on a per-queue condition variable server-side (no
busy-spin).  Clients ask for at most ``MAX_WAIT`` seconds per request and loop,
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

from mlless.protocol.framing import U8, U16, U32, FrameError, Reader, pack_blob

from .base import SUPERVISOR, check_job_id, check_key

__all__ = ["EmbeddedBroker"]

log = logging.getLogger(__name__)

# Ops; 3 and 9 were a TTL query and a queue deletion that only tests ever sent, and stay unassigned.
OP_PING, OP_PUT_MANY, OP_GET_MANY, OP_DELETE_JOB = 0, 1, 2, 4
OP_DECLARE, OP_SEND, OP_BROADCAST, OP_RECEIVE = 5, 6, 7, 8
# statuses
ST_OK, ST_ERROR, ST_UNROUTABLE, ST_NO_QUEUE = 0, 1, 2, 3

LEN = U32
I32 = struct.Struct("<i")
U64 = struct.Struct("<Q")

#: Longest a single RECEIVE request blocks server-side; clients loop for longer waits.
MAX_WAIT = 1.0
DEFAULT_MAX_REQUEST = 1 << 30


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
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

    Listens on a Unix domain socket (default: in a fresh temp dir) and serves
    from construction on.  One thread per client connection; all state sits
    behind one lock, with one condition variable per queue so a send wakes only
    that queue's receiver.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        max_request: int = DEFAULT_MAX_REQUEST,
        sweep_interval: float = 5.0,
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
        #: Requests rejected as malformed; each is also logged.
        self.malformed = 0

        if path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="mlless-broker-")
            path = os.path.join(self._tmpdir, "broker.sock")
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)  # only this user's processes may join the job
        self.address = f"unix:{path}"
        self._sock.listen(128)
        self._sock.settimeout(0.5)  # the accept loop wakes up to notice stop()
        self._start_thread(self._accept_loop, "mlless-broker-accept")
        self._start_thread(self._sweep_loop, "mlless-broker-sweep")

    # ------------------------------------------------------------------ lifecycle
    def _start_thread(self, target, name: str, *args: object) -> threading.Thread:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

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
            # shutdown wakes the accept loop's blocked accept() now (Linux); close alone leaves it to its timeout,
            # a quarter of a second at the end of every local job on average
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedBroker":
        return self

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
                head = recv_exact(conn, 4)
                if head is None:
                    return
                (n,) = LEN.unpack(head)
                if n == 0 or n > self._max_request:
                    self._count_malformed(f"request length {n} out of range")
                    # The stream cannot be resynchronised: answer, then hang up.
                    self._reply(conn, ST_ERROR, f"request length {n} out of range".encode())
                    return
                body = recv_exact(conn, n)
                if body is None:
                    return
                try:
                    status, payload = self._handle(conn, body)
                except FrameError as exc:
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
        conn.sendall(LEN.pack(1 + len(payload)) + U8.pack(status) + payload)

    # ------------------------------------------------------------------ operations
    def _handle(self, conn: socket.socket, body: bytes) -> tuple[int, bytes]:
        r = Reader(body)
        (op,) = r.unpack(U8)
        if op == OP_PING:
            r.end()
            return ST_OK, b""
        job = r.text(U16, "job id")
        try:
            check_job_id(job)
        except ValueError as exc:
            raise FrameError(str(exc)) from None

        if op == OP_PUT_MANY:
            (ttl_ms,) = r.unpack(U64)
            (count,) = r.unpack(U32)
            if ttl_ms == 0:
                raise FrameError("ttl must be > 0")
            items = []
            for _ in range(count):
                items.append((self._key(r.text(U16, "key")), r.blob(U32)))
            r.end()
            exp = time.monotonic() + ttl_ms / 1000.0
            with self._lock:
                for k, v in items:
                    self._kv[(job, k)] = (v, exp)
            return ST_OK, b""

        if op == OP_GET_MANY:
            (count,) = r.unpack(U32)
            keys = [self._key(r.text(U16, "key")) for _ in range(count)]
            r.end()
            now = time.monotonic()
            parts = [U32.pack(count)]
            with self._lock:
                for k in keys:
                    hit = self._kv.get((job, k))
                    if hit is None or hit[1] <= now:
                        parts.append(b"\x00")
                    else:
                        parts.append(b"\x01" + pack_blob(hit[0], U32))
            return ST_OK, b"".join(parts)

        if op == OP_DELETE_JOB:
            r.end()
            with self._lock:
                keys = [k for k in self._kv if k[0] == job]
                for k in keys:
                    del self._kv[k]
                for qk in [qk for qk in self._queues if qk[0] == job]:
                    self._queues.pop(qk).cv.notify_all()
            return ST_OK, U64.pack(len(keys))

        if op == OP_DECLARE:
            rank = self._rank(r)
            r.end()
            with self._lock:
                self._queues.setdefault((job, rank), _Queue(self._lock))
            return ST_OK, b""

        if op == OP_SEND:
            rank = self._rank(r)
            msg = r.blob(U32)
            r.end()
            with self._lock:
                q = self._queues.get((job, rank))
                if q is None:
                    return ST_UNROUTABLE, f"no queue for rank {rank} in job {job}".encode()
                q.items.append(msg)
                q.cv.notify()
            return ST_OK, b""

        if op == OP_BROADCAST:
            msg = r.blob(U32)
            r.end()
            with self._lock:
                for (j, rank), q in self._queues.items():
                    if j == job and rank >= 0:
                        q.items.append(msg)
                        q.cv.notify()
            return ST_OK, b""

        if op == OP_RECEIVE:
            rank = self._rank(r)
            (timeout_ms,) = r.unpack(U32)
            r.end()
            return self._receive(conn, job, rank, min(timeout_ms / 1000.0, MAX_WAIT))

        raise FrameError(f"unknown op {op}")

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
            raise FrameError(str(exc)) from None

    @staticmethod
    def _rank(r: Reader) -> int:
        (rank,) = r.unpack(I32)
        if rank < SUPERVISOR:
            raise FrameError(f"invalid queue rank {rank}")
        return rank


def _alive(conn: socket.socket) -> bool:
    """True unless the peer has closed its end (a pending EOF is visible with MSG_PEEK)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False

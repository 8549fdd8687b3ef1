"""Transport contract tests, run against both the embedded broker and real Redis + RabbitMQ."""
from __future__ import annotations

import os
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pika
import pytest
import redis

from mlless.contract import (
    ENV_AMQP_URL, ENV_EMBEDDED_ADDRESS, ENV_IDENTITY, ENV_RABBITMQ_CA_FILE, ENV_REDIS_CA_FILE, ENV_REDIS_URL, ENV_SECRETS_DIR,
)
from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.identity import Identity, Issuer, Verifier
from mlless.protocol.messages import Close, Done, Finish, Hello, Report, Update
from mlless.protocol.sealing import SEAL_BYTES, Rejected, seal, unseal
from mlless.transport import (
    EmbeddedBroker,
    Transport,
    TransportError,
    UnroutableError,
    connect,
    redact_url,
)
from mlless.transport.base import MESSAGE_CONTEXT, SUPERVISOR, value_context
from mlless.transport.bus import REDECLARE_SECONDS, queue_names
from mlless.transport.credentials import identity as env_identity
from mlless.transport.tls import TrustedCA, ca_from_env, redis_tls_options, untrusted_certificate

# Same overrides as tests/conftest.py.  Services tests fail (not skip) when the
# servers are down: passing without them would prove nothing.
REDIS_URL = os.environ.get("MLLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("MLLESS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: The session's issuer (tests/conftest.py), which connect() reads from the environment.
ISSUER = env_identity(os.environ)
assert isinstance(ISSUER, Issuer)


def send_to_worker(env: dict[str, str], job: str, rank: int, body: bytes,
                   identity: Identity | None = ISSUER.issue(SUPERVISOR)) -> None:
    """Queue ``body`` for one worker through the backend's own protocol (the broker's SEND op, or pika): the
    runtime only ever broadcasts to workers, so a transport has no such call.  Sealed by ``identity`` (the
    supervisor's) as a transport would, unless it is None."""
    if identity is not None:
        body = seal(body, identity, MESSAGE_CONTEXT)
    address = env.get(ENV_EMBEDDED_ADDRESS)
    if address is not None:
        request = struct.pack("<BH", 6, len(job)) + job.encode() + struct.pack("<iI", rank, len(body)) + body
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(address[len("unix:") :])
            s.settimeout(5)
            status, text = _ask(s, request)
        if status == 2:
            raise UnroutableError(text.decode())
        assert status == 0, text
        return
    import pika

    with pika.BlockingConnection(pika.URLParameters(env[ENV_AMQP_URL])) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        try:
            channel.basic_publish("", queue_names(job)["worker"].format(rank=rank), body, mandatory=True)
        except pika.exceptions.UnroutableError:
            raise UnroutableError(f"no queue for worker {rank}") from None


class Backend:
    """Opens transports for one test and cleans every job it touched."""

    def __init__(self, kind: str, env: dict[str, str], broker: EmbeddedBroker | None = None) -> None:
        self.kind = kind
        self.env = env  # what a subprocess needs to connect (via connect()'s env fallback)
        self.broker = broker
        self.job = "test-" + uuid.uuid4().hex[:12]
        self.opened: list[Transport] = []

    def send_to_worker(self, rank: int, body: bytes, identity: Identity | None = ISSUER.issue(SUPERVISOR)) -> None:
        send_to_worker(self.env, self.job, rank, body, identity)

    def ttl_of(self, key: str) -> float | None:
        """Seconds ``key`` has left, read from the store itself: Redis's PTTL, or the in-process broker's table."""
        if self.broker is None:
            with redis.Redis.from_url(REDIS_URL) as r:
                ms = r.pttl(f"mlless:{self.job}:{key}")
            return None if ms == -2 else ms / 1000
        hit = self.broker._kv.get((self.job, key))
        return None if hit is None else hit[1] - time.monotonic()

    def connect(self, role: str = "worker", rank: int | None = None, job: str | None = None, **kw: object) -> Transport:
        if self.kind == "embedded":
            t = connect(job or self.job, embedded_address=self.env[ENV_EMBEDDED_ADDRESS], role=role, rank=rank, **kw)  # type: ignore[arg-type]
        else:
            t = connect(job or self.job, redis_url=REDIS_URL, amqp_url=AMQP_URL, role=role, rank=rank, **kw)  # type: ignore[arg-type]
        self.opened.append(t)
        return t

    def cleanup(self) -> None:
        jobs = {t.job_id for t in self.opened}
        for job in jobs:
            try:
                t = self.connect("supervisor", job=job)
                t.delete_job()
            except TransportError:
                pass
        for t in self.opened:
            try:
                t.close()
            except TransportError:
                pass


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    yield b
    b.stop()


@pytest.fixture(params=["embedded", pytest.param("services", marks=pytest.mark.services)])
def backend(request: pytest.FixtureRequest, broker: EmbeddedBroker) -> Iterator[Backend]:
    if request.param == "services":
        env = {ENV_REDIS_URL: REDIS_URL, ENV_AMQP_URL: AMQP_URL}
    else:
        env = {ENV_EMBEDDED_ADDRESS: broker.address}
    b = Backend(request.param, env, broker if request.param == "embedded" else None)
    yield b
    b.cleanup()


# --------------------------------------------------------------------------- key-value


def test_put_get_many_and_missing(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    w = backend.connect("worker", 0)
    sup.put("a", b"alpha")
    w.put("b", b"")
    w.put("c", bytes(range(256)) * 10)
    assert w.get_many(["a", "b", "c", "nope"]) == [b"alpha", b"", bytes(range(256)) * 10, None]
    assert sup.get_many(["nope"]) == [None]
    assert sup.get_many([]) == []
    sup.put("a", b"overwritten")
    assert w.get_many(["a"]) == [b"overwritten"]


def test_big_values(backend: Backend) -> None:
    t = backend.connect("worker", rank=1)
    upd = Update(1, 3, np.arange(1_000_000), np.ones(1_000_000, np.float32))
    frame = encode(upd, compress=False)
    t.put("u:1:3", frame)
    t.put("r:1", os.urandom(3_000_000))
    got = t.get_many(["u:1:3"])[0]
    assert got is not None
    assert decode(got, size=1_000_000) == upd


def test_ttl_is_set(backend: Backend) -> None:
    t = backend.connect("supervisor", ttl=3600)
    t.put("k", b"v")
    ttl = backend.ttl_of("k")
    assert ttl is not None and 3500 < ttl <= 3600
    assert backend.ttl_of("missing") is None
    t.put("long", b"v", ttl=7200)  # one key that outlives the rest (a suspended job's checkpoint)
    assert 7100 < backend.ttl_of("long") <= 7200


def test_ttl_expires(backend: Backend) -> None:
    t = backend.connect("supervisor", ttl=1)
    t.put("short", b"v")
    assert t.get_many(["short"]) == [b"v"]
    time.sleep(1.3)
    assert t.get_many(["short"]) == [None]


@pytest.mark.services
def test_services_keys_are_namespaced_with_redis_ttl() -> None:
    job = "test-" + uuid.uuid4().hex[:12]
    t = connect(job, redis_url=REDIS_URL, amqp_url=AMQP_URL, role="supervisor")
    try:
        t.put("x", b"1")
        r = redis.Redis.from_url(REDIS_URL)
        stored = r.get(f"mlless:{job}:x")
        assert stored[:1] == b"1" and len(stored) == 1 + SEAL_BYTES
        assert unseal(stored, Verifier(ISSUER.public), value_context("x")) == b"1"
        assert r.ttl(f"mlless:{job}:x") > 0
    finally:
        t.delete_job()
        t.close()


def test_delete_job_only_this_job(backend: Backend) -> None:
    mine = backend.connect("supervisor")
    other_job = "test-" + uuid.uuid4().hex[:12]
    other = backend.connect("supervisor", job=other_job)
    for i in range(1200):  # more than one SCAN/UNLINK batch
        mine.put(f"k{i}", b"x")
    other.put("k1", b"keep")
    other.put("k2", b"keep")
    assert mine.delete_job() == 1200
    assert mine.get_many(["k1", "k2", "k1199"]) == [None, None, None]
    assert other.get_many(["k1", "k2"]) == [b"keep", b"keep"]
    assert other.delete_job() == 2


def test_delete_job_removes_queues(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    w = backend.connect("worker", 3)
    backend.send_to_worker(3, b"pending")
    sup.delete_job()
    with pytest.raises(UnroutableError):
        backend.connect("worker", 4).send_to_supervisor(b"x")
    w.close()


@pytest.mark.services
def test_a_successors_reset_clears_the_keys_but_is_no_lost_store_to_the_workers() -> None:
    """A supervisor taking over resets the job while its predecessor's workers still run: they must see their
    values gone, not a Redis that lost the job (which would make them drop the replica the successor asks for)."""
    backend = Backend("services", {ENV_REDIS_URL: REDIS_URL, ENV_AMQP_URL: AMQP_URL})
    try:
        w = backend.connect("worker", 0)
        w.put("replica", b"r")
        backend.connect("supervisor").reset()
        assert w.get_many(["replica"]) == [None]
        w.probe_store()
        assert w.store_epoch == 0
    finally:
        backend.cleanup()


@pytest.mark.services
@pytest.mark.parametrize("written", ["members", "type"])
def test_delete_job_trusts_nothing_it_reads_in_the_rank_registry(broker: EmbeddedBroker, written: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Issue #22: a member of `_ranks` that is no rank (or `_ranks` of another type) once made cleanup raise a
    ValueError and leave every key and queue behind. Now it is skipped with one logged line; the rest goes."""
    backend = Backend("services", {ENV_REDIS_URL: REDIS_URL, ENV_AMQP_URL: AMQP_URL})
    try:
        sup = backend.connect("supervisor")
        backend.connect("worker", 3)
        sup.put("model", b"x")
        ranks_key = f"mlless:{backend.job}:_ranks"
        with redis.Redis.from_url(REDIS_URL) as r:
            if written == "members":
                r.sadd(ranks_key, "abc", "-1", "9" * 30)
            else:
                r.delete(ranks_key)
                r.set(ranks_key, "not a set")
        sup.delete_job()
        with redis.Redis.from_url(REDIS_URL) as r:
            assert list(r.scan_iter(match=f"mlless:{backend.job}:*")) == []
        assert "_ranks" in caplog.text
        if written == "members":  # the real rank's queue went with the job
            with pytest.raises(UnroutableError):
                backend.send_to_worker(3, b"late")
    finally:
        backend.cleanup()


def _queue_exists(name: str) -> bool:
    with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as conn:
        try:
            conn.channel().queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
    return True


@pytest.mark.services
def test_a_worker_declares_its_deleted_queue_again_but_not_after_the_job_ends() -> None:
    """Issue #22: a worker whose queue was deleted (by hand, or expired) never declared it again, heard nothing
    more, and was dropped. Now it declares it again; unless the job's exchange went too, as at a job's end."""
    backend = Backend("services", {ENV_REDIS_URL: REDIS_URL, ENV_AMQP_URL: AMQP_URL})
    try:
        sup, w = backend.connect("supervisor"), backend.connect("worker", 0)
        assert w.receive(0.1) is None  # consuming
        queue = queue_names(backend.job)["worker"].format(rank=0)
        with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as conn:
            conn.channel().queue_delete(queue)
        sup.broadcast(encode(Finish(-1, 0)))  # lost with the queue: no consumer, and no queue to hold it
        assert w.receive(REDECLARE_SECONDS + 1.5) is None
        sup.broadcast(encode(Finish(-1, 0)))
        assert isinstance(decode(w.receive(2.0) or b""), Finish)
        sup.delete_job()  # the supervisor at the end of a job: queues, then the exchange
        assert w.receive(REDECLARE_SECONDS + 1.5) is None
        assert not _queue_exists(queue)
    finally:
        backend.cleanup()


def test_invalid_names() -> None:
    with pytest.raises(ValueError):
        connect("bad job*", embedded_address="unix:/nonexistent", role="supervisor")
    with pytest.raises(ValueError):
        connect("job", embedded_address="unix:/nonexistent", role="worker")  # no rank
    with pytest.raises(ValueError):
        connect("job", embedded_address="x", redis_url="redis://h", role="supervisor")


def test_values_and_messages_not_sealed_by_a_member_come_back_rejected(backend: Backend) -> None:
    """An outsider (another issuer's identity, or none) can write into the job's keys and queues, but what it wrote
    never reads back as a frame: the reader gets a Rejected, which decode refuses with the reason."""
    sup = backend.connect("supervisor")
    w = backend.connect("worker", rank=0)
    outsider = backend.connect("worker", rank=1, identity=Issuer())
    frame = encode(Update(0, 3, np.array([1]), np.array([0.5], np.float32)))
    outsider.put("update:0:3", frame)
    outsider.send_to_supervisor(frame)
    outsider.broadcast(frame)
    backend.send_to_worker(0, frame, identity=None)
    got = sup.get_many(["update:0:3"])[0]
    assert isinstance(got, Rejected)
    with pytest.raises(FrameError, match="^value update:0:3: bad or missing seal: not written by a member of this job$"):
        decode(got)
    for receiver in (sup, w, w):
        with pytest.raises(FrameError, match="^message: bad or missing seal"):
            decode(receiver.receive(5.0))
    w.put("update:0:3", frame)  # a member's frame reads back as written, and only under its own key
    assert sup.get_many(["update:0:3"]) == [frame]
    if backend.kind == "services":
        import redis

        with redis.Redis.from_url(REDIS_URL) as r:
            r.copy(f"mlless:{backend.job}:update:0:3", f"mlless:{backend.job}:update:0:4")
            r.set(f"mlless:{backend.job}:update:0:5", frame)  # no seal at all
            stored = r.get(f"mlless:{backend.job}:update:0:3")
            r.set(f"mlless:{backend.job}:update:0:6", stored[:-1] + bytes([stored[-1] ^ 1]))  # signature changed
        got = sup.get_many(["update:0:4", "update:0:5", "update:0:6"])
        assert [isinstance(v, Rejected) for v in got] == [True, True, True]
        assert got[2].reason == "value update:0:6: bad signature: not written by rank 0 of this job, or changed since"


def test_a_member_cannot_pass_for_another_rank_or_the_supervisor(backend: Backend) -> None:
    """Rank 1 holds its own identity, certified by the job's issuer: what it writes as rank 0's update, or sends as
    rank 0's report or the supervisor's finish, reads back rejected, with the reason."""
    sup = backend.connect("supervisor")
    w0 = backend.connect("worker", rank=0)
    w1 = backend.connect("worker", rank=1, identity=ISSUER.issue(1))
    update = encode(Update(0, 3, np.array([1]), np.array([0.5], np.float32)), sealed=True)
    w1.put("update:0:3", update)  # rank 0's slot
    w1.put("snapshot", update)  # a shared key: the frame's sender gives it away
    w1.put("job-state", b"{}")  # the supervisor's
    got = w0.get_many(["update:0:3", "snapshot", "job-state"])
    assert got[0].reason == "value update:0:3: sealed by rank 1, which may not write it: forged"
    assert got[2].reason == "value job-state: sealed by rank 1, which may not write it: forged"
    for value in got:
        with pytest.raises(FrameError, match="forged$"):
            decode(value)
    with pytest.raises(FrameError, match="^frame from sender 0 was sealed by rank 1: forged$"):
        decode(got[1])
    w1.send_to_supervisor(encode(Done(0, 3, 1.0), sealed=True))
    w1.broadcast(encode(Finish(SUPERVISOR, 3), sealed=True))
    with pytest.raises(FrameError, match="^frame from sender 0 was sealed by rank 1: forged$"):
        decode(sup.receive(5.0))
    with pytest.raises(FrameError, match="^frame from sender -1 was sealed by rank 1: forged$"):
        decode(w0.receive(5.0))
    w1.put("update:1:3", encode(Update(1, 3, np.array([1]), np.array([0.5], np.float32)), sealed=True))
    assert decode(w0.get_many(["update:1:3"])[0]).sender == 1  # its own still reads
    with pytest.raises(TransportError, match="^the identity of rank 1 cannot speak as rank 0$"):
        backend.connect("worker", rank=0, identity=ISSUER.issue(1))


def test_no_transport_without_a_valid_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_IDENTITY)
    with pytest.raises(TransportError, match=f"^no identity: set {ENV_IDENTITY}, or the file identity under"):
        connect("test-nokey", embedded_address="unix:/nonexistent", role="supervisor")
    monkeypatch.setenv(ENV_IDENTITY, "not-hex-" + ISSUER.text())
    with pytest.raises(TransportError, match=f"^{ENV_IDENTITY}: not an identity: "):
        connect("test-nokey", embedded_address="unix:/nonexistent", role="supervisor")
    monkeypatch.delenv(ENV_IDENTITY)
    mine = ISSUER.issue(2)
    (tmp_path / "identity").write_text(mine.text()[:-2] + "\n")
    with pytest.raises(TransportError, match=f"^{tmp_path / 'identity'}: not an identity: "):
        env_identity({ENV_SECRETS_DIR: str(tmp_path)})
    (tmp_path / "identity").write_text(mine.text() + "\n")  # as OpenFaaS mounts it
    assert env_identity({ENV_SECRETS_DIR: str(tmp_path)}).badge == mine.badge


def test_the_key_is_never_shown(backend: Backend) -> None:
    t = backend.connect("supervisor")
    secret = ISSUER.text().split(":")[1]
    assert secret not in repr(t) and t._identity.text().split(":")[1] not in repr(t)
    assert secret not in repr(ISSUER) and "Identity(the supervisor)" == repr(t._identity)


def test_invalid_keys(backend: Backend) -> None:
    t = backend.connect("supervisor")
    for bad in ("", "a*", "a b", "_ranks", "x" * 600):
        with pytest.raises(ValueError):
            t.put(bad, b"v")
    with pytest.raises(TypeError):
        t.put("k", "not bytes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- messages


def test_send_receive_ordering(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    w0 = backend.connect("worker", 0)
    w1 = backend.connect("worker", 1)
    for i in range(200):
        (w0 if i % 2 else w1).send_to_supervisor(struct.pack("<I", i))
    got = [struct.unpack("<I", sup.receive(2.0) or b"")[0] for _ in range(200)]
    assert sorted(got) == list(range(200))
    assert [g for g in got if g % 2] == list(range(1, 200, 2))  # per-sender FIFO
    for i in range(50):
        backend.send_to_worker(1, struct.pack("<I", i))
    assert [struct.unpack("<I", w1.receive(2.0) or b"")[0] for _ in range(50)] == list(range(50))
    assert w0.receive(0) is None
    assert sup.receive(0) is None


def test_broadcast_reaches_all_bound_workers(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    workers = [backend.connect("worker", r) for r in range(4)]
    frame = encode(Close(-1, 7, 28, 0, (0, 1, 2, 3), (1, 3)))
    sup.broadcast(frame)
    for w in workers:
        msg = decode(w.receive(2.0) or b"")
        assert isinstance(msg, Close) and msg.updates == (1, 3)
        assert w.receive(0) is None
    assert sup.receive(0.05) is None  # the supervisor is not a broadcast target


def test_late_worker_misses_earlier_broadcast(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    early = backend.connect("worker", 0)
    sup.broadcast(b"one")
    late = backend.connect("worker", 1)
    sup.broadcast(b"two")
    assert early.receive(2.0) == b"one"
    assert early.receive(2.0) == b"two"
    assert late.receive(2.0) == b"two"
    assert late.receive(0.05) is None


def test_broadcast_with_no_workers_is_fine(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    sup.broadcast(b"nobody listens")


def test_receive_timeout_returns_none(backend: Backend) -> None:
    w = backend.connect("worker", 0)
    t0 = time.monotonic()
    assert w.receive(0.3) is None
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 1.5
    t0 = time.monotonic()
    assert w.receive(0) is None
    assert time.monotonic() - t0 < 0.2


def test_blocking_receive_wakes_on_send(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    w = backend.connect("worker", 0)

    def later() -> None:
        time.sleep(0.2)
        backend.send_to_worker(0, b"wake")

    th = threading.Thread(target=later)
    th.start()
    t0 = time.monotonic()
    assert w.receive(None) == b"wake"
    assert time.monotonic() - t0 < 1.5
    th.join()
    assert sup.receive(0) is None


def test_unroutable_send_leaves_the_transport_usable(backend: Backend) -> None:
    w = backend.connect("worker", 0)
    with pytest.raises(UnroutableError):
        w.send_to_supervisor(b"x")
    sup = backend.connect("supervisor")
    w.send_to_supervisor(b"still usable")
    assert sup.receive(1.0) == b"still usable"


def test_worker_without_supervisor_is_unroutable(backend: Backend) -> None:
    w = backend.connect("worker", 0)
    with pytest.raises(UnroutableError):
        w.send_to_supervisor(b"x")


def test_posted_reports_arrive_in_order_and_a_failure_surfaces_at_the_next_call(backend: Backend) -> None:
    w = backend.connect("worker", 0)
    with pytest.raises(UnroutableError):  # no supervisor queue yet: raised now (the default) or at the next call
        w.post_to_supervisor(b"lost")
        w.put("k", b"v")
    w.put("k", b"v2")  # the connection is still in step: answers are not mixed up
    assert w.get_many(["k"]) == [b"v2"]
    sup = backend.connect("supervisor")
    for i in range(100):
        w.post_to_supervisor(struct.pack("<I", i))
    assert w.get_many(["k"]) == [b"v2"]  # a call after posts reads their answers first
    assert [struct.unpack("<I", sup.receive(2.0) or b"")[0] for _ in range(100)] == list(range(100))


def test_closed_transport_refuses(backend: Backend) -> None:
    w = backend.connect("worker", 2)
    w.close()
    with pytest.raises(TransportError):
        w.receive(0)


def test_reconnecting_worker_keeps_queued_messages(backend: Backend) -> None:
    """A re-invoked rank (function time limit) finds messages sent while it was away."""
    w = backend.connect("worker", 5)
    w.close()
    backend.send_to_worker(5, b"while away")
    w2 = backend.connect("worker", 5)
    assert w2.receive(2.0) == b"while away"


_WORKER_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from mlless.protocol.framing import decode, encode
    from mlless.protocol.messages import Close, Done, Finish, Hello, Report, Update
    from mlless.transport import connect
    job, rank = sys.argv[1], int(sys.argv[2])
    t = connect(job, role="worker", rank=rank)          # address/urls come from the environment
    t.send_to_supervisor(encode(Hello(rank, 0, os.getpid())))
    step = 0
    while True:
        msg = decode(t.receive(30.0))
        if isinstance(msg, Close):
            step = msg.step
            t.put(f"u:{rank}:{step}", encode(Update(rank, step, [rank], [float(step)])))
            t.send_to_supervisor(encode(Report(rank, step, 1.0, 10, True, 0, 1, 0, (0.0,) * 7)))
        elif isinstance(msg, Finish):
            t.send_to_supervisor(encode(Done(rank, msg.step, 0.5)))
            break
    t.close()
    """
)


def test_messages_between_processes(backend: Backend) -> None:
    sup = backend.connect("supervisor")
    env = {**os.environ, **backend.env}
    env.pop(ENV_EMBEDDED_ADDRESS if backend.kind == "services" else ENV_REDIS_URL, None)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER_SCRIPT, backend.job, str(r)], env=env) for r in range(2)
    ]
    try:
        hellos = {}
        for _ in range(2):
            m = decode(sup.receive(30.0) or b"")
            assert isinstance(m, Hello)
            hellos[m.sender] = m.pid
        assert hellos == {p_rank: p.pid for p_rank, p in enumerate(procs)}
        for step in (1, 2):
            sup.broadcast(encode(Close(-1, step, 0, 0, (0, 1), ())))
            reports = [decode(sup.receive(30.0) or b"") for _ in range(2)]
            assert {(r.sender, r.step) for r in reports} == {(0, step), (1, step)}
            ups = [decode(b or b"", size=2) for b in sup.get_many([f"u:0:{step}", f"u:1:{step}"])]
            assert [int(u.indices[0]) for u in ups] == [0, 1]  # type: ignore[attr-defined]
        sup.broadcast(encode(Finish(-1, 2)))
        dones = {decode(sup.receive(30.0) or b"").sender for _ in range(2)}
        assert dones == {0, 1}
        for p in procs:
            assert p.wait(30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# --------------------------------------------------------------------------- latency


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


@pytest.mark.slow
def test_latency(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    """Median send→receive hop and put/get_many round trip on loopback (n=1000)."""
    sup = backend.connect("supervisor")
    w = backend.connect("worker", 0)
    body = encode(Report(0, 1, 1.0, 10, True, 0, 1, 0, (0.0,) * 7))
    hop = []
    for _ in range(1000):
        t0 = time.perf_counter()
        w.send_to_supervisor(body)
        assert sup.receive(5.0) is not None
        hop.append(time.perf_counter() - t0)
    value = os.urandom(4096)
    kv = []
    for i in range(1000):
        t0 = time.perf_counter()
        w.put("u:0:1", value)
        assert sup.get_many(["u:0:1"])[0] == value
        kv.append(time.perf_counter() - t0)
    with capsys.disabled():
        print(
            f"\n[{backend.kind}] send->receive hop median {_median_ms(hop):.3f} ms; "
            f"put+get_many 4 KiB median {_median_ms(kv):.3f} ms"
        )
    assert _median_ms(hop) < 5 and _median_ms(kv) < 5


# --------------------------------------------------------------------------- embedded specifics


def _raw(broker: EmbeddedBroker) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(broker.address[len("unix:") :])
    s.settimeout(5)
    return s


def _ask(s: socket.socket, body: bytes) -> tuple[int, bytes]:
    s.sendall(struct.pack("<I", len(body)) + body)
    n = struct.unpack("<I", s.recv(4))[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    return data[0], data[1:]


def test_embedded_malformed_requests_are_counted_not_fatal() -> None:
    with EmbeddedBroker() as b:
        s = _raw(b)
        cases = [
            b"\x63",  # unknown op without job
            b"\x01",  # truncated
            b"\x01\x03\x00abc",  # put_many missing fields
            b"\x01\x03\x00ab*" + struct.pack("<QI", 1000, 0),  # bad job id
            b"\x02\x03\x00abc" + struct.pack("<I", 1) + b"\x02\x00_x",  # reserved key
            b"\x00extra",  # ping with trailing bytes
            b"\x08\x03\x00abc" + struct.pack("<iI", -7, 10),  # bad rank
            b"\x02\x03\x00abc" + struct.pack("<I", 1) + b"\x02\x00\xff\xfe",  # non-utf8 key
        ]
        for body in cases:
            status, msg = _ask(s, body)
            assert status == 1, body
        assert b.malformed == len(cases)
        assert _ask(s, b"\x00") == (0, b"")  # same connection still served
        # An absurd length prefix: error response, then the server hangs up that connection only.
        s.sendall(struct.pack("<I", 2**31))
        assert s.recv(5)[4] == 1
        assert b.malformed == len(cases) + 1
        t = connect("job1", embedded_address=b.address, role="supervisor")
        t.put("k", b"v")
        assert t.get_many(["k"]) == [b"v"]
        # A client that dies mid-request does not hurt either.
        s2 = _raw(b)
        s2.sendall(struct.pack("<I", 100) + b"\x01")
        s2.close()
        assert t.get_many(["k"]) == [b"v"]
        t.close()


def test_embedded_stop_cleans_socket_and_wakes_receivers() -> None:
    b = EmbeddedBroker()
    path = b.address[len("unix:") :]
    assert os.path.exists(path) and (os.stat(path).st_mode & 0o777) == 0o600
    w = connect("job2", embedded_address=b.address, role="worker", rank=0)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            w.receive(None)
        except TransportError as exc:
            errors.append(exc)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.2)
    b.stop()
    th.join(5)
    assert not th.is_alive() and errors
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_embedded_blocking_receive_does_not_spin() -> None:
    with EmbeddedBroker() as b:
        w = connect("job3", embedded_address=b.address, role="worker", rank=0)
        cpu0, t0 = time.process_time(), time.monotonic()
        assert w.receive(1.0) is None
        assert time.monotonic() - t0 >= 0.95
        assert time.process_time() - cpu0 < 0.2  # server thread + client together
        w.close()


def test_embedded_many_concurrent_clients() -> None:
    with EmbeddedBroker() as b:
        sup = connect("job4", embedded_address=b.address, role="supervisor")
        n = 16

        def worker(rank: int) -> None:
            t = connect("job4", embedded_address=b.address, role="worker", rank=rank)
            for i in range(50):
                t.put(f"k{rank}", struct.pack("<I", i))
                t.send_to_supervisor(struct.pack("<II", rank, i))
            t.close()

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(n)]
        for th in threads:
            th.start()
        got = [struct.unpack("<II", sup.receive(10.0) or b"") for _ in range(n * 50)]
        for th in threads:
            th.join()
        for r in range(n):
            assert [i for rr, i in got if rr == r] == list(range(50))
        assert sup.get_many([f"k{r}" for r in range(n)]) == [struct.pack("<I", 49)] * n
        sup.close()


def test_dead_receiver_does_not_swallow_message() -> None:
    """A killed worker blocked in receive must leave the next message for its successor."""
    with EmbeddedBroker() as b:
        sup = connect("job5", embedded_address=b.address, role="supervisor")
        script = (
            "import sys; from mlless.transport import connect; "
            "t = connect('job5', embedded_address=sys.argv[1], role='worker', rank=0); "
            "print('ready', flush=True); t.receive(None)"
        )
        p = subprocess.Popen([sys.executable, "-c", script, b.address], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        p.kill()
        p.wait()
        send_to_worker({ENV_EMBEDDED_ADDRESS: b.address}, "job5", 0, b"for the successor")
        time.sleep(0.1)
        w = connect("job5", embedded_address=b.address, role="worker", rank=0)
        assert w.receive(3.0) == b"for the successor"
        w.close()
        sup.close()


# --------------------------------------------------------------------------- services specifics


def test_redact_url() -> None:
    assert redact_url("amqp://user:s3cret@rabbit:5672/%2F") == "amqp://user:***@rabbit:5672/%2F"
    assert redact_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("redis://redis:6379/0") == "redis://redis:6379/0"
    assert "s3cret" not in redact_url("amqp://u:s3cret@[::1]:5672/")
    assert redact_url(None) == "None"


def test_tls_options_follow_the_url_and_the_environment() -> None:
    assert ca_from_env("redis", {}) is None
    assert ca_from_env("amqp", {ENV_RABBITMQ_CA_FILE: "/x/ca.pem"}) == TrustedCA(ENV_RABBITMQ_CA_FILE, file="/x/ca.pem")
    assert redis_tls_options("redis://h:6379/0", None) == {}
    assert redis_tls_options("rediss://h:6380/0", None) == {"ssl_check_hostname": True}  # the system's CAs


def test_a_ca_for_a_plain_url_is_an_error() -> None:
    ca = TrustedCA(ENV_REDIS_CA_FILE, file="/x/ca.pem")
    with pytest.raises(TransportError) as exc:
        redis_tls_options("redis://:hunter2@h:6379/0", ca)
    assert str(exc.value) == (f"{ENV_REDIS_CA_FILE}=/x/ca.pem is set but redis://:***@h:6379/0 does not use TLS: "
                              f"use rediss:// or drop {ENV_REDIS_CA_FILE}")


def test_a_bad_ca_file_is_reported_before_connecting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Named by the environment, as in a pod; nothing listens on port 1, so any connection attempt would fail."""
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    for path, reason in [(tmp_path / "missing.pem", "no such file"),
                         (not_pem, "not a PEM bundle of CA certificates (NO_CERTIFICATE_OR_CRL_FOUND)")]:
        monkeypatch.setenv(ENV_REDIS_CA_FILE, str(path))
        with pytest.raises(TransportError) as exc:
            connect("test-ca", redis_url="rediss://:hunter2@localhost:1/0", amqp_url="amqps://localhost:1/%2F",
                    role="supervisor")
        assert str(exc.value) == f"{ENV_REDIS_CA_FILE}={path}: {reason}"


def test_a_certificate_failure_is_found_behind_redis_wrapping() -> None:
    try:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed")
        except OSError:
            raise redis.ConnectionError("Error 1 connecting to h:6380.")  # as redis-py does
    except redis.ConnectionError as wrapped:
        assert isinstance(untrusted_certificate(wrapped), ssl.SSLCertVerificationError)
    assert untrusted_certificate(redis.ConnectionError("Connection refused")) is None


@pytest.mark.services
def test_services_errors_never_show_passwords() -> None:
    with pytest.raises(TransportError) as exc:
        connect(
            "test-pw",
            redis_url="redis://:hunter2@127.0.0.1:6379/0",
            amqp_url="amqp://guest:hunter2@127.0.0.1:5672/%2F",
            role="supervisor",
            outage_seconds=0,
        )
    assert "hunter2" not in str(exc.value) and "***" in str(exc.value)
    with pytest.raises(TransportError) as exc:
        connect("test-pw", redis_url="redis://:hunter2@127.0.0.1:1/0", amqp_url=AMQP_URL, role="worker", rank=0,
                redis_retries=0, socket_timeout=0.5)
    assert "hunter2" not in str(exc.value)


@pytest.mark.services
def test_services_reconnects_after_connection_loss() -> None:
    """A dropped AMQP socket is re-established with backoff; queued messages survive."""
    job = "test-" + uuid.uuid4().hex[:12]
    sup = connect(job, redis_url=REDIS_URL, amqp_url=AMQP_URL, role="supervisor")
    w = connect(job, redis_url=REDIS_URL, amqp_url=AMQP_URL, role="worker", rank=0)
    try:
        send_to_worker({ENV_AMQP_URL: AMQP_URL}, job, 0, b"before")
        # Kill the worker's TCP connection under pika's feet.
        w._bus._conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        assert w.receive(5.0) == b"before"  # redelivered: it was never acked
        sup.broadcast(b"after")
        assert w.receive(5.0) == b"after"
        w.send_to_supervisor(b"up")
        assert sup.receive(5.0) == b"up"
    finally:
        sup.delete_job()
        sup.close()
        w.close()


def test_embedded_explicit_path(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "b.sock")
    b = EmbeddedBroker(path)
    assert b.address == f"unix:{path}"
    t = connect("job6", embedded_address=b.address, role="supervisor")
    t.put("k", b"v")
    assert t.get_many(["k"]) == [b"v"]
    t.close()
    b.stop()
    b.stop()
    assert not os.path.exists(path)

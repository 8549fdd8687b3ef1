"""A worker cannot pass for another rank or for the supervisor, on either transport.

Each process of a job seals with its own identity (`mlless.protocol.identity`): `mlless train` hands each worker
only its own. A worker gone wrong is played here by a forger holding worker m's identity, from that worker's
environment as the worker recorded it (`worker_env`, readable by a process of the same user only). While the job
trains it writes, sealed as rank m: 1e30-valued updates into its peer's update slots, the supervisor's close (final,
with m alone live) and finish to every worker, and a `Failed` of its peer to the supervisor. Any one of them,
accepted, would end the job early, drop the peer or wreck every replica; each is rejected, counted and logged with
its reason, and the job ends as if nothing was sent.

The job runs as `mlless train` over a Redis of the test's own and this package's RabbitMQ node, or over the embedded
broker, which the forger reaches through its socket as any process of the user can.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pika
import pytest
import redis
import yaml

from mlless.contract import ENV_EMBEDDED_ADDRESS, ENV_IDENTITY, ENV_JOB_ID, ENV_PLUGINS, ENV_RANK
from mlless.protocol import keys
from mlless.protocol.framing import HEADER, U16, U32, encode, pack_blob, pack_text
from mlless.protocol.identity import Identity, parse_identity
from mlless.protocol.messages import CLOSE_FINAL, Close, Failed, Finish
from mlless.protocol.sealing import seal
from mlless.transport.base import MESSAGE_CONTEXT, SUPERVISOR, key_prefix, value_context
from mlless.transport.bus import queue_names
from mlless.transport.embedded_broker import I32, LEN, OP_BROADCAST, OP_GET_MANY, OP_PUT_MANY, OP_SEND, U64, U8, recv_exact

from faults.test_forged_frames import unharmed, update_frame
from faults.test_outages import STEPS, start_job, wait_for_steps
from faults.test_supervisor_loss import children
import worker_env
from worker_env import worker_environ

pytestmark = [pytest.mark.slow]


class RedisAndRabbit:
    """Where the forger writes on the services transport: the job's Redis keys and RabbitMQ queues."""

    def __init__(self, redis_url: str, amqp_url: str, job_id: str) -> None:
        self.r, self.prefix, self.amqp_url, self.names = redis.Redis.from_url(redis_url), key_prefix(job_id), amqp_url, \
            queue_names(job_id)

    def get(self, name: str) -> bytes | None:
        return self.r.get(self.prefix + name)

    def put(self, name: str, value: bytes) -> None:
        self.r.set(self.prefix + name, value)

    def messages(self, to_workers: list[bytes], to_supervisor: list[bytes]) -> None:
        with pika.BlockingConnection(pika.URLParameters(self.amqp_url)) as conn:
            channel = conn.channel()
            for body in to_workers:
                channel.basic_publish(self.names["exchange"], "", body)
            for body in to_supervisor:
                channel.basic_publish("", self.names["supervisor"], body)


class Broker:
    """Where the forger writes on the embedded transport: requests to the broker's socket, as a client makes them."""

    def __init__(self, address: str, job_id: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address.removeprefix("unix:"))
        self.sock.settimeout(10)
        self.job = pack_text(job_id, U16)
        # The forger's thread and the test's share the socket: one request and its answer at a time.
        self.lock = threading.Lock()

    def call(self, op: int, fields: bytes) -> bytes:
        body = U8.pack(op) + self.job + fields
        with self.lock:
            self.sock.sendall(LEN.pack(len(body)) + body)
            (n,) = LEN.unpack(recv_exact(self.sock, 4))
            answer = recv_exact(self.sock, n)
        assert answer[0] == 0, answer
        return answer[1:]

    def get(self, name: str) -> bytes | None:
        payload = self.call(OP_GET_MANY, U32.pack(1) + pack_text(name, U16))
        return payload[9:] if len(payload) > 4 and payload[4] else None  # count u32, present u8, length u32

    def put(self, name: str, value: bytes) -> None:
        self.call(OP_PUT_MANY, U64.pack(600_000) + U32.pack(1) + pack_text(name, U16) + pack_blob(value, U32))

    def messages(self, to_workers: list[bytes], to_supervisor: list[bytes]) -> None:
        for body in to_workers:
            self.call(OP_BROADCAST, pack_blob(body, U32))
        for body in to_supervisor:
            self.call(OP_SEND, I32.pack(SUPERVISOR) + pack_blob(body, U32))


class RankForger(threading.Thread):
    """Writes, sealed as the worker whose identity it holds, 1e30 updates into its peer's update slots until stopped."""

    def __init__(self, store: RedisAndRabbit | Broker, identity: Identity, peer: int) -> None:
        super().__init__(daemon=True)
        self.store, self.identity, self.peer = store, identity, peer
        self.stop, self.written = threading.Event(), 0

    def run(self) -> None:
        slots = [keys.update(self.peer, step, 0) for step in range(keys.update_slots(0))]  # BSP: staleness 0
        while not self.stop.wait(0.005):
            for name in slots:
                current = self.store.get(name)
                if current is None or len(current) < HEADER.size:
                    continue
                step = HEADER.unpack_from(current)[5]
                forged = update_frame(self.peer, step, 1e30)  # the peer's, for the step it is at
                self.store.put(name, seal(forged, self.identity, value_context(name)))
                self.written += 1


def start_embedded_job(dataset: Path, run_dir: Path) -> subprocess.Popen:
    manifest = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "forged-ranks"},
                "spec": {"workers": 2, "model": {"type": "pmf"}, "sync": {"protocol": "bsp"},
                         "dataset": {"uri": str(dataset), "cacheBatches": True}, "stop": {"maxSteps": STEPS, "patience": 0},
                         "evaluation": {"everySteps": 10}}}
    job = run_dir.parent / f"{run_dir.name}.yaml"
    job.write_text(yaml.safe_dump(manifest))
    return subprocess.Popen([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run_dir), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, ENV_PLUGINS: worker_env.__file__})


@pytest.mark.parametrize("transport", [pytest.param("services", marks=pytest.mark.services), "embedded"])
def test_a_worker_cannot_forge_another_rank_or_the_supervisor(transport, request, movielens_dir, tmp_path):
    run_dir = tmp_path / "run"
    if transport == "services":
        rabbit, redis_url = request.getfixturevalue("rabbit"), request.getfixturevalue("private_redis")
        proc = start_job(movielens_dir, run_dir, redis_url, rabbit.url)
    else:
        proc = start_embedded_job(movielens_dir, run_dir)
    wait_for_steps(run_dir, proc, 20)
    held = worker_environ(run_dir, children(proc.pid)[0])
    job_id, rank = held[ENV_JOB_ID], int(held[ENV_RANK])
    identity = parse_identity(held[ENV_IDENTITY])
    assert isinstance(identity, Identity) and identity.signer == rank  # its own identity; the issuer stays home
    assert "issuer:" not in "".join(worker_environ(run_dir, pid).get(ENV_IDENTITY, "") for pid in children(proc.pid))
    peer = 1 - rank
    store = RedisAndRabbit(redis_url, rabbit.url, job_id) if transport == "services" else \
        Broker(held[ENV_EMBEDDED_ADDRESS], job_id)

    forger = RankForger(store, identity, peer)
    forger.start()
    step = len((run_dir / "metrics.jsonl").read_text().splitlines())
    as_rank = [encode(m, sealed=True) for m in (Close(SUPERVISOR, step, 0, CLOSE_FINAL, (rank,), (), ()),
                                               Finish(SUPERVISOR, step))]
    store.messages([seal(body, identity, MESSAGE_CONTEXT) for body in as_rank],
                   [seal(encode(Failed(peer, step, "forged"), sealed=True), identity, MESSAGE_CONTEXT)])
    wait_for_steps(run_dir, proc, STEPS * 2 // 3)
    forger.stop.set()
    forger.join(timeout=10)
    logs = unharmed(proc, run_dir)  # the close and the finish at each worker, the Failed, and updates: rejected
    assert forger.written > 20
    for reason in (f"frame from sender -1 was sealed by rank {rank}: forged",
                   f"frame from sender {peer} was sealed by rank {rank}: forged",
                   f"sealed by rank {rank}, which may not write it: forged"):
        assert reason in logs, reason
    assert held[ENV_IDENTITY].split(":")[1] not in logs

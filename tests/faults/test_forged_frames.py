"""Frames written into a running job's Redis keys and RabbitMQ queues by someone else are rejected and counted.

Before, a well-formed update frame with 1e30 values written into Redis was applied: every worker hit NaN and the
job failed. Now every frame carries its writer's seal (`mlless.protocol.sealing.seal`), and update and replica
values are bounded (`mlless.protocol.messages.MAX_MAGNITUDE`). The job runs as `mlless train` over a Redis of the
test's own and this module's RabbitMQ node; the forger writes while it trains: frames without a seal, sealed by
another job's identity, and, as a member gone wrong would (a worker's identity, from its environment as the worker
recorded it, `worker_env`, readable by a process of the same user only), sealed by that worker around 1e30 or NaN values: in its own slots the bound stops
them, in its peers' the seal (tests/faults/test_forged_ranks.py forges ranks and the supervisor on both transports).
The forger goes on until every kind of rejection is in the job's logs (a forgery counts only if a reader reads it
before the real frame replaces it), and the job is long enough for that to happen well before its end.
"""
from __future__ import annotations

import json
import math
import subprocess
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pika
import pytest
import redis

from mlless.contract import ENV_IDENTITY, ENV_JOB_ID, ENV_RANK, STOP_MAX_STEPS
from mlless.protocol import keys, layouts
from mlless.protocol.framing import HEADER, MAGIC, VERSION, FrameType, decode, encode
from mlless.protocol.messages import Failed, Finish, Tensors, Update
from mlless.protocol.identity import SUPERVISOR, Identity, Issuer, Verifier, parse_identity
from mlless.protocol.sealing import Rejected, seal, unseal
from mlless.transport.base import MESSAGE_CONTEXT, key_prefix, value_context
from mlless.transport.bus import queue_names

from faults.test_outages import STEPS, start_job, wait_for_steps
from faults.test_supervisor_loss import children
from worker_env import worker_environ

pytestmark = [pytest.mark.slow, pytest.mark.services]

#: The job's length: the forging ends at most FORGE_UNTIL steps into it, so it always runs to its end unharmed.
STEPS_FORGED = 3 * STEPS
FORGE_UNTIL = 2 * STEPS


def environ(pid: int) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line)


def frame(ftype: FrameType, sender: int, step: int, payload: bytes) -> bytes:
    """A well-formed frame around `payload`, which the message classes would refuse to build."""
    return HEADER.pack(MAGIC, VERSION, ftype, 0, sender, step, len(payload), zlib.crc32(payload)) + payload


def update_frame(sender: int, step: int, value: float) -> bytes:
    """An update of 16 entries, all `value` (the values end the payload, whatever carries the indices)."""
    n = 16
    payload = encode(Update(sender, step, np.arange(n), np.zeros(n, np.float32)))[HEADER.size:]
    return frame(FrameType.UPDATE, sender, step, payload[:-4 * n] + np.full(n, value, "<f4").tobytes())


def snapshot_frame(sender: int, step: int, size: int) -> bytes:
    """A replica of `size` parameters, all 1e30 (finite in float32, so only the bound stops it)."""
    payload = encode(Tensors(sender, step, {layouts.PARAMS: np.zeros(size, np.float32)}))[HEADER.size:]
    return frame(FrameType.TENSORS, sender, step, payload[:-4 * size] + np.full(size, 1e30, "<f4").tobytes())


def unharmed(proc: subprocess.Popen, run_dir: Path, steps: int = STEPS, stderr: Path | None = None) -> str:
    """Check that the job `proc` ran to its last step with both workers and a finite model, having rejected at least
    five frames; return everything it logged (its stderr piped, or written to `stderr`)."""
    out, err = proc.communicate(timeout=300)
    err = stderr.read_text() if stderr else err
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == steps
    assert summary["dropped_workers"] == [] and summary["workers_final"] == 2
    assert summary["rejected_frames"] >= 5  # the forged messages, and update forgeries
    assert summary["validation_loss"] is not None and math.isfinite(summary["validation_loss"])
    with np.load(run_dir / "model.npz") as model:
        assert np.isfinite(model["params"]).all() and np.abs(model["params"]).max() < 100
    return out + err + "".join(p.read_text() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".npz")


class Forger(threading.Thread):
    """Overwrites the job's update slots and its snapshot, round after round, until stopped."""

    def __init__(self, redis_url: str, job_id: str, identity: Identity) -> None:
        super().__init__(daemon=True)
        self.r, self.prefix, self.identity = redis.Redis.from_url(redis_url), key_prefix(job_id), identity
        self.verifier = Verifier(identity.issuer)
        self.stop, self.written = threading.Event(), 0
        self.forged: Counter[str] = Counter()  # forgeries written per slot
        self.snapshot: tuple[int, int] | None = None  # (step, size) of the newest real snapshot
        # A snapshot is read within milliseconds of being put: a thread of its own looks for it all the time.
        self.snapshots = threading.Thread(target=self.forge_snapshots, daemon=True)

    def sealed(self, name: str, forged: bytes) -> bytes:
        return seal(forged, self.identity, value_context(name))

    def forgeries(self, name: str, sender: int, step: int) -> list[bytes]:
        """The four kinds, for the slot `name` now holding `sender`'s update for `step` (so that only the seal or the
        values give them away)."""
        forged = update_frame(sender, step, 1e30)
        return [forged, seal(forged, Issuer().issue(sender), value_context(name)), self.sealed(name, forged),
                self.sealed(name, update_frame(sender, step, float("nan")))]

    def run(self) -> None:
        while not self.stop.wait(0.005):
            for full in self.r.scan_iter(match=self.prefix + "update:*"):
                name = full.decode().removeprefix(self.prefix)
                current = self.r.get(full)
                if current is None or len(current) < HEADER.size:
                    continue
                _, _, _, _, sender, step, _, _ = HEADER.unpack_from(current)
                # Each slot gets the four kinds in turn. Counted over all slots, the kind a slot got depended on
                # where the scan, in an order fixed by the key names' hashes, found it: six slots a round, so a
                # slot got the kinds of its position's parity only, and for about one job name in seven all of a
                # rank's slots had one parity (never a NaN, or never a 1e30, in the forged rank's own slots).
                self.r.set(full, self.forgeries(name, sender, step)[self.forged[name] % 4])
                self.forged[name] += 1
                self.written += 1

    def forge_snapshots(self) -> None:
        """Overwrite each real snapshot, and the empty value of one asked for and not put yet, with a forgery."""
        while not self.stop.wait(0.0005):
            snapshot = unseal(self.r.get(self.prefix + keys.snapshot()) or b"", self.verifier,
                              value_context(keys.snapshot()))
            if isinstance(snapshot, Rejected):
                continue  # not there, or a forgery of ours
            if snapshot:
                replica = decode(snapshot)
                self.snapshot = replica.step, replica.arrays[layouts.PARAMS].size
            if self.snapshot is not None:
                self.r.set(self.prefix + keys.snapshot(), self.sealed(keys.snapshot(),
                                                                    snapshot_frame(self.identity.signer, *self.snapshot)))


def forge_until_logged(proc: subprocess.Popen, run_dir: Path, stderr: Path, reasons: list[str]) -> None:
    """Wait until each of `reasons` is in the job's logs (its workers' and the supervisor's); fail, naming those
    missing, if the job reaches FORGE_UNTIL steps first."""
    metrics = run_dir / "metrics.jsonl"
    while True:
        logs = stderr.read_text() + "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
        missing = [reason for reason in reasons if reason not in logs]
        if not missing:
            return
        assert proc.poll() is None, proc.communicate()
        steps = len(metrics.read_text().splitlines())
        assert steps < FORGE_UNTIL, f"after {steps} steps of forging, never rejected: {missing}"
        time.sleep(0.1)


def test_forged_frames_are_rejected_counted_and_never_applied(rabbit, private_redis, movielens_dir, tmp_path):
    run_dir, stderr = tmp_path / "run", tmp_path / "supervisor.log"
    proc = start_job(movielens_dir, run_dir, private_redis, rabbit.url, steps=STEPS_FORGED, stderr=stderr)
    wait_for_steps(run_dir, proc, 20)
    workers = children(proc.pid)
    job_id, key_text, rank = (worker_environ(run_dir, workers[0])[name] for name in (ENV_JOB_ID, ENV_IDENTITY, ENV_RANK))
    identity = parse_identity(key_text)
    assert isinstance(identity, Identity) and identity.signer == int(rank)  # its own, and not the issuer
    assert key_text != environ(proc.pid).get(ENV_IDENTITY)  # `mlless train` made the job's own issuer
    assert key_text not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout

    forger = Forger(private_redis, job_id, identity)
    forger.start()
    forger.snapshots.start()
    # Control frames too: a Failed from worker 0 would drop it, a Finish would end the job early.
    names = queue_names(job_id)
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as conn:
        channel = conn.channel()
        failed = encode(Failed(sender=0, step=0, reason="forged"))
        for body in (failed, seal(failed, Issuer().issue(0), MESSAGE_CONTEXT)):
            channel.basic_publish("", names["supervisor"], body)
        channel.basic_publish(names["exchange"], "", encode(Finish(sender=SUPERVISOR, step=0)))
    reasons = ["rejected frame: message: bad or missing seal: not written by a member of this job",
               "rejected control frame: message: bad or missing seal",
               "bad or missing seal: not written by a member of this job", "values reach 1e+30, beyond the bound",
               f"sealed by rank {rank}, which may not write it: forged",
               "values contains NaN or inf", "rejected replica: params reach 1e+30, beyond the bound"]
    try:
        forge_until_logged(proc, run_dir, stderr, reasons)
    finally:
        forger.stop.set()
        forger.join(timeout=10)
        forger.snapshots.join(timeout=10)
    logs = unharmed(proc, run_dir, STEPS_FORGED, stderr)
    assert forger.written > 20
    for reason in reasons:
        assert reason in logs, reason
    assert key_text not in logs

"""A supervisor killed with -9: its workers notice the silence and stop within spec.liveness.supervisorTimeoutSeconds.

Before, orphaned workers kept running (and billing) for 3 × workerTimeoutSeconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mlless.contract import ENV_JOB_ID
from mlless.transport import connect

from faults.test_outages import start_job, wait_for_steps
from worker_env import worker_environ

pytestmark = [pytest.mark.slow, pytest.mark.services]

TIMEOUT = 10.0


def children(pid: int) -> list[int]:
    """The worker processes `pid` started: its children, and, for its zygote (launch/zygote.py), the zygote's."""
    found = []
    for child in _children(pid):
        try:
            zygote = b" zygote " in Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except FileNotFoundError:
            continue
        found += _children(child) if zygote else [child]
    return found


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_workers_of_a_killed_supervisor_stop_within_the_timeout(movielens_dir, tmp_path, redis_url, amqp_url):
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, redis_url, amqp_url, steps=1_000_000,
                     liveness={"supervisorTimeoutSeconds": TIMEOUT})
    wait_for_steps(run_dir, proc, 20)
    workers = children(proc.pid)
    assert len(workers) == 2
    job_id = worker_environ(run_dir, workers[0])[ENV_JOB_ID]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    try:
        while any(alive(w) for w in workers) and time.monotonic() - killed < 3 * TIMEOUT:
            time.sleep(0.2)
        stopped_after = time.monotonic() - killed
        assert not any(alive(w) for w in workers), f"workers still running {stopped_after:.0f}s after the kill"
        assert stopped_after <= TIMEOUT + 5.0  # the silence bound, plus one receive poll and the exit
        assert (run_dir / "metrics.jsonl").exists() and (run_dir / "state.json").exists()  # test_failover.py resumes it
    finally:
        for w in workers:
            if alive(w):
                os.kill(w, signal.SIGKILL)
        transport = connect(job_id, redis_url=redis_url, amqp_url=amqp_url, role="supervisor")
        transport.delete_job()
        transport.close()

"""Local workers forked from a zygote (launch/zygote.py): real jobs, real processes.

Each worker's environment is read from what it recorded itself (`worker_env`, a plugin): a forked worker's
/proc/PID/environ is the zygote's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import worker_env
from mlless.cli import main
from mlless.contract import (
    ENV_EMBEDDED_ADDRESS,
    ENV_IDENTITY,
    ENV_JOB_ID,
    ENV_PLUGINS,
    ENV_RANK,
    EXIT_USAGE,
    STOP_INTERRUPTED,
    STOP_MAX_EPOCHS,
)
from mlless.protocol.identity import Identity, Issuer, parse_identity
from mlless.launch.launcher import LocalLauncher
from mlless.runtime.local import Services, train_local
from mlless.launch.zygote import Zygote, _running
from mlless.transport.embedded_broker import EmbeddedBroker

from test_sweep import sweep_doc, write
from test_training import QUIET, job_for


@pytest.fixture(autouse=True)
def recording(monkeypatch):
    monkeypatch.setenv(ENV_PLUGINS, worker_env.__file__)


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def zygotes() -> list[int]:
    """This process's zygotes."""
    found = []
    for pid in children(os.getpid()):
        try:
            if b"zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except FileNotFoundError:  # `ps` itself, ended
            pass
    return found


def gone(pid: int) -> bool:
    """Ended and reaped: neither running nor a zombie."""
    return not Path(f"/proc/{pid}").exists()


def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_forked_workers_train_a_job_each_with_its_own_environment_and_leave_nothing(movielens_dir, tmp_path,
                                                                                   monkeypatch):
    with Zygote() as zygote:
        monkeypatch.chdir(tmp_path)  # after the zygote's start: a worker starts where its launcher is, as a new one would
        summary = train_local(job_for(movielens_dir, workers=2, stop={"maxEpochs": 1}), tmp_path, Services(), QUIET,
                              zygote=zygote)
        assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["dropped_workers"] == []
        workers = worker_env.recorded(tmp_path)
        assert [w["environ"][ENV_RANK] for w in workers] == ["0", "1"]
        for rank, w in enumerate(workers):
            assert w["ppid"] == zygote.proc.pid and w["sid"] == w["pid"]  # a fork, in a session of its own
            assert w["cwd"] == str(tmp_path)
            assert w["environ"][ENV_JOB_ID] == summary["job_id"]
            identity = parse_identity(w["environ"][ENV_IDENTITY])
            assert isinstance(identity, Identity) and identity.signer == rank  # its own, never the issuer
            assert ENV_IDENTITY not in w["proc_environ"]  # the zygote's start environment, with nobody's identity
        assert workers[0]["environ"][ENV_IDENTITY] != workers[1]["environ"][ENV_IDENTITY]
        assert children(zygote.proc.pid) == [] and all(gone(w["pid"]) for w in workers)  # ended and reaped
    assert zygote.proc.returncode == 0 and gone(zygote.proc.pid)


def test_a_networks_workers_are_forked_with_torch_imported(digits_dir, tmp_path):
    pytest.importorskip("torch")
    network = {"type": "neural-net", "network": "mlp", "hiddenSizes": [8]}
    summary = train_local(job_for(digits_dir, workers=2, model=network, stop={"maxSteps": 3}), tmp_path / "net",
                          Services(), QUIET)
    assert summary["steps"] == 3
    assert [w["preloaded"] for w in worker_env.recorded(tmp_path / "net")] == [["torch", "torchvision.models"]] * 2
    with Zygote() as bare:  # a zygote for a model type without slow imports leaves them to the worker
        train_local(job_for(digits_dir, workers=1, model=network, stop={"maxSteps": 1}), tmp_path / "bare",
                    Services(), QUIET, zygote=bare)
    assert [w["preloaded"] for w in worker_env.recorded(tmp_path / "bare")] == [[]]


@pytest.fixture
def idle_job(movielens_dir, tmp_path):
    """A job file and the environment of workers that connect to a broker and wait for a supervisor that never
    comes (for liveness.supervisorTimeoutSeconds: they run until killed)."""
    job = job_for(movielens_dir, workers=2, liveness={"supervisorTimeoutSeconds": 600})
    (tmp_path / "job.json").write_text(job.to_json())
    with EmbeddedBroker(str(tmp_path / "broker.sock")) as broker:
        yield tmp_path / "job.json", {ENV_JOB_ID: "idle-0", ENV_EMBEDDED_ADDRESS: broker.address}


def test_exits_are_reported_stop_kills_and_the_zygotes_start_is_billed_once(idle_job, tmp_path):
    job_file, env = idle_job
    with Zygote() as zygote:
        launcher = LocalLauncher(job_file, env, tmp_path / "logs", Issuer(), zygote)
        first, second = launcher.start(0), launcher.start(1)
        # The first worker is billed the zygote's start: its launch until it was ready, less what it waited itself.
        assert 0 < first <= zygote._ready_at - zygote.launched and second == 0
        broken = LocalLauncher(tmp_path / "missing.json", env, tmp_path / "logs", Issuer(), zygote)
        assert broken.start(2) == 0
        until(lambda: broken.exited() == [2])
        assert broken.procs[2].poll() == EXIT_USAGE
        assert "mlless: error:" in (tmp_path / "logs" / "worker-2.log").read_text()  # its stderr is its log
        until(lambda: all((worker_env.folder(tmp_path) / f"{launcher.pid(r)}.json").exists() for r in (0, 1)))
        assert launcher.exited() == []
        launcher.stop(0)
        until(lambda: launcher.exited() == [0])
        assert launcher.procs[0].poll() == -signal.SIGKILL and _running(launcher.pid(1))
        survivor = launcher.pid(1)
    # The job owning the zygote is over: what still ran of its workers was killed, and reaped.
    assert gone(survivor) and gone(zygote.proc.pid)


def test_workers_waiting_together_for_the_zygote_bill_its_start_once(idle_job, tmp_path):
    """Two trials of a sweep start together, before their zygote is ready: the first forked is billed the zygote's
    start, the other from when the zygote was ready (its `Launcher.start` is minus its wait)."""
    job_file, env = idle_job
    with Zygote() as zygote:
        launcher = LocalLauncher(job_file, env, tmp_path / "logs", Issuer(), zygote)
        billed_from: dict[int, float] = {}

        def start(rank: int) -> None:
            asked = time.monotonic()
            billed_from[rank] = asked - launcher.start(rank)  # as `Membership.start` bills it

        threads = [threading.Thread(target=start, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        first, second = sorted(billed_from.values())
        assert first == pytest.approx(zygote.launched, abs=0.05)
        assert zygote._ready_at - 0.05 <= second <= time.monotonic()
        launcher.stop_all(grace=0.0)


def test_a_worker_is_a_new_process_when_the_environment_changed_since_the_zygote_started(idle_job, tmp_path,
                                                                                         monkeypatch):
    job_file, env = idle_job
    with Zygote() as zygote:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # read at numpy's import: a fork would not honour it
        launcher = LocalLauncher(job_file, env, tmp_path / "logs", Issuer(), zygote)
        launcher.start(0)
        assert isinstance(launcher.procs[0], subprocess.Popen) and children(zygote.proc.pid) == []
        launcher.stop_all(grace=0.0)
        assert launcher.procs[0].returncode == -signal.SIGKILL


def test_an_interrupted_job_leaves_no_process(movielens_dir, tmp_path):
    """Ctrl-C (SIGINT to `mlless train`) mid-job: the job ends cleanly, its workers and its zygote are gone."""
    found: list[int] = []

    def interrupt_when_training(supervisor) -> None:
        found.extend(zygotes())
        until(lambda: (tmp_path / "metrics.jsonl").exists() and (tmp_path / "metrics.jsonl").read_text().count("\n") > 5)
        os.kill(os.getpid(), signal.SIGINT)

    def on_start(supervisor) -> None:
        threading.Thread(target=interrupt_when_training, args=(supervisor,), daemon=True).start()

    summary = train_local(job_for(movielens_dir, workers=2, stop={"maxSteps": 100_000, "patience": 0}), tmp_path, Services(), QUIET,
                          on_start=on_start)
    assert summary["stop_reason"] == STOP_INTERRUPTED
    workers = worker_env.recorded(tmp_path)
    assert len(found) == 1 and len(workers) == 2 and {w["ppid"] for w in workers} == set(found)
    assert gone(found[0]) and all(gone(w["pid"]) for w in workers) and zygotes() == []


def test_a_job_that_fails_before_it_starts_leaves_no_zygote(movielens_dir, tmp_path):
    def fail(supervisor) -> None:
        assert len(zygotes()) == 1
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        train_local(job_for(movielens_dir, workers=2), tmp_path, Services(), QUIET, on_start=fail)
    assert zygotes() == []


def test_a_sweep_forks_every_trial_from_one_zygote(synthetic_lr_dir, tmp_path):
    doc = sweep_doc(synthetic_lr_dir, earlyStopping={"type": "none"}, maxConcurrentTrials=2)
    doc["spec"]["template"]["spec"]["stop"] = {"maxSteps": 30}
    assert main(["sweep", str(write(tmp_path, doc)), "--out", str(tmp_path / "out"), "-q"]) == 0
    trials = sorted(p for p in (tmp_path / "out" / "trials").iterdir() if p.suffix != ".env")
    workers = [w for trial in trials for w in worker_env.recorded(trial)]
    assert len(trials) == 3 and len(workers) == 3
    parents = {w["ppid"] for w in workers}
    assert len(parents) == 1 and os.getpid() not in parents  # one zygote, shared
    assert all(gone(pid) for pid in parents | {w["pid"] for w in workers}) and zygotes() == []

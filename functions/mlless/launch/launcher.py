"""How the supervisor starts and stops worker functions.

Locally each worker is a real OS process (`python -m mlless worker`). On a
cluster the operator tells the supervisor how its job's backend runs workers
(`worker_launcher`): invoked over HTTP, where the supervisor invokes each rank
(`HttpLauncher`), re-invoking it whenever an invocation returns at its deadline
with a checkpoint (Knative, OpenFaaS); or started externally, one pod per rank,
which the supervisor only watches arrive (`ExternalLauncher`); there, failure
detection relies on the step timeout alone.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Mapping

from mlless.contract import (
    ENV_FUNCTION_TIMEOUT_SECONDS,
    ENV_IDENTITY,
    ENV_JOB_FILE,
    ENV_RANK,
    ENV_WORKER_BACKEND,
    ENV_WORKER_INVOCATION,
    ENV_WORKER_URL,
    FUNCTION_TIMEOUT_SECONDS,
    WORKER_INVOCATION_EXTERNAL,
    WORKER_INVOCATION_HTTP,
)
from mlless.protocol.identity import Issuer
from mlless.launch.zygote import Zygote, ZygoteError
from mlless.spec import TrainingJob
from mlless.transport.credentials import invoke_token

log = logging.getLogger(__name__)


class Launcher(ABC):
    #: The supervisor can start a worker of any rank (scale-out); pods are started by the operator instead.
    starts_workers = True
    #: On Kubernetes the platform removes workers on scale-in (the removed pod's worker leaves on SIGTERM),
    #: so a scale request from outside must not also make the supervisor evict one.
    platform_scales_in = False
    @abstractmethod
    def start(self, rank: int) -> float:
        """Start worker `rank`; returns the seconds of start-up spent for it before this call, billed with it (a
        zygote's start, for the first worker forked from it), or, negative, the seconds of this call not billed to it
        (its wait for a zygote's start, billed to the first); usually 0."""

    @abstractmethod
    def exited(self) -> list[int]:
        """Ranks whose invocation has ended since they were started (empty if unknown)."""

    @abstractmethod
    def stop(self, rank: int) -> None: ...

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every worker this launcher started, after `grace` seconds for them to end on their own."""


class LocalLauncher(Launcher):
    """Workers as processes of this machine, each in its own session so a terminal Ctrl-C reaches only the supervisor.

    With a `zygote` (launch/zygote.py) each is a fork of that warm process, which has imported what a worker runs;
    without one, or when it cannot serve (this process's environment changed since it started; it ended), a new
    `python -m mlless worker`.
    """

    def __init__(self, job_file: Path, env: dict[str, str], log_dir: Path, issuer: Issuer,
                 zygote: Zygote | None = None) -> None:
        self.job_file = job_file
        self.env = env
        self.log_dir = log_dir
        self.issuer = issuer
        self.zygote = zygote
        self.procs: dict[int, subprocess.Popen[bytes] | Forked] = {}

    def start(self, rank: int) -> float:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A worker gets its own identity and nothing it could seal as anyone else with; a joiner's is made when
        # it starts, and goes with its process.
        env = {**os.environ, **self.env, ENV_RANK: str(rank), ENV_JOB_FILE: str(self.job_file),
               ENV_IDENTITY: self.issuer.issue(rank).text()}
        with (self.log_dir / f"worker-{rank}.log").open("ab") as log_file:
            if self.zygote is not None and self.zygote.serves(os.environ):
                try:
                    pid, charge = self.zygote.spawn(env, log_file.fileno())
                    self.procs[rank] = Forked(self.zygote, pid)
                    return charge
                except ZygoteError as exc:
                    log.warning("worker %d: %s; starting it as a new process", rank, exc)
            self.procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "mlless", "worker"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return 0.0

    def exited(self) -> list[int]:
        return [rank for rank, proc in self.procs.items() if proc.poll() is not None]

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def stop(self, rank: int) -> None:
        """Kill a worker the job gave up on; never blocks, since the supervisor's loop must keep closing steps."""
        proc = self.procs.get(rank)
        if proc is not None and proc.poll() is None:
            proc.kill()

    def stop_all(self, grace: float = 5.0) -> None:
        """At the end of the job: workers exit on their own after the final close; stragglers are killed."""
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Forked:
    """A worker forked by a zygote, with the part of `subprocess.Popen` the launcher uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid

    def poll(self) -> int | None:
        return self.zygote.returncode(self.pid)

    def kill(self) -> None:
        self.zygote.kill(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        code = self.zygote.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return code


class ExternalLauncher(Launcher):
    """Workers started by someone else (the operator's worker pods); nothing to do here."""

    starts_workers = False
    platform_scales_in = True

    def start(self, rank: int) -> float:
        return 0.0

    def exited(self) -> list[int]:
        return []

    def stop(self, rank: int) -> None:
        pass


#: Answers that mean "no free function instance right now": try again.
_RETRY_STATUSES = {429, 502, 503, 504}


class HttpLauncher(Launcher):
    """Workers as HTTP function invocations: the Knative Service URL or the OpenFaaS gateway.

    Each rank has one thread that POSTs its invocation and blocks until it
    returns. An invocation that returns "checkpointed" (its deadline was near)
    is invoked again with `resume`; one that returns "finished" or "failed",
    or cannot be delivered within `connect_timeout`, counts as exited.
    """

    platform_scales_in = True

    def __init__(
        self, url: str, job: TrainingJob, job_id: str, timeout_seconds: float, connect_timeout: float = 120.0, token: str | None = None
    ) -> None:
        self.url = url
        self.headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
        self.job = json.loads(job.to_json())
        self.job_id = job_id
        self.timeout_seconds = timeout_seconds
        # The worker must return before the platform cuts the request: leave a tenth, 5 to 30 s, for the checkpoint.
        self.deadline_seconds = max(1.0, timeout_seconds - min(30.0, max(5.0, 0.1 * timeout_seconds)))
        self.connect_timeout = connect_timeout
        self.results: dict[int, dict] = {}
        self.invocations: dict[int, int] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._abandoned: set[int] = set()
        self._lock = threading.Lock()

    def start(self, rank: int) -> float:
        thread = threading.Thread(target=self._run, args=(rank,), name=f"invoke-{rank}", daemon=True)
        self._threads[rank] = thread
        thread.start()
        return 0.0

    def _run(self, rank: int) -> None:
        resume = False
        while True:
            result = self._invoke(rank, resume)
            with self._lock:
                self.invocations[rank] = self.invocations.get(rank, 0) + 1
                if result.get("status") != "checkpointed" or rank in self._abandoned:
                    self.results[rank] = result
                    return
            resume = True

    def _invoke(self, rank: int, resume: bool) -> dict:
        body = json.dumps(
            {"rank": rank, "jobId": self.job_id, "job": self.job, "resume": resume, "deadlineSeconds": self.deadline_seconds}
        ).encode()
        give_up = time.monotonic() + self.connect_timeout
        delay = 0.1
        while True:
            request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_seconds + 30) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code not in _RETRY_STATUSES:
                    detail = exc.read()[:300].decode(errors="replace")
                    return {"rank": rank, "status": "failed", "error": f"HTTP {exc.code}: {detail}"}
                reason = f"HTTP {exc.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > give_up:
                return {"rank": rank, "status": "failed", "error": f"could not invoke {self.url}: {reason}"}
            log.debug("rank %d: invocation not accepted (%s); retrying", rank, reason)
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    def exited(self) -> list[int]:
        with self._lock:
            return list(self.results)

    def stop(self, rank: int) -> None:
        """A running invocation cannot be cancelled over HTTP; the dropped worker leaves at the next close. Never re-invoke it."""
        with self._lock:
            self._abandoned.add(rank)

    def stop_all(self, grace: float = 5.0) -> None:
        with self._lock:
            self._abandoned.update(self._threads)
        deadline = time.monotonic() + grace
        for thread in self._threads.values():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def worker_launcher(env: Mapping[str, str], job: TrainingJob, job_id: str) -> Launcher:
    """How a cluster's supervisor reaches its workers: by MLLESS_WORKER_INVOCATION, which the operator sets from the
    job's backend (external when unset). ValueError if it is neither kind, or http without MLLESS_WORKER_URL."""
    invocation = env.get(ENV_WORKER_INVOCATION, WORKER_INVOCATION_EXTERNAL)
    if invocation == WORKER_INVOCATION_EXTERNAL:
        return ExternalLauncher()
    url = env.get(ENV_WORKER_URL)
    if invocation != WORKER_INVOCATION_HTTP or not url:
        raise ValueError(f"{ENV_WORKER_INVOCATION}={invocation!r} (backend {ENV_WORKER_BACKEND}={env.get(ENV_WORKER_BACKEND)!r}) needs to be "
                         f"{WORKER_INVOCATION_EXTERNAL}, or {WORKER_INVOCATION_HTTP} with {ENV_WORKER_URL}")
    timeout = float(env.get(ENV_FUNCTION_TIMEOUT_SECONDS, FUNCTION_TIMEOUT_SECONDS))
    return HttpLauncher(url, job, job_id, timeout, token=invoke_token(env))

"""How the supervisor starts and stops worker functions.

Locally each worker is a real OS process (`python -m mlless worker`). On
Kubernetes the operator creates the functions and the supervisor only
watches them arrive, which `ExternalLauncher` stands for; there, failure
detection relies on the step timeout alone.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path


class Launcher(ABC):
    @abstractmethod
    def start(self, rank: int) -> None: ...

    @abstractmethod
    def exited(self) -> list[int]:
        """Ranks whose invocation has ended since they were started (empty if unknown)."""

    @abstractmethod
    def stop(self, rank: int) -> None: ...

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every worker this launcher started, after `grace` seconds for them to end on their own."""


class LocalLauncher(Launcher):
    """Workers as child processes, each in its own session so a terminal Ctrl-C reaches only the supervisor."""

    def __init__(self, job_file: Path, env: dict[str, str], log_dir: Path) -> None:
        self.job_file = job_file
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, rank: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "MLLESS_RANK": str(rank), "MLLESS_JOB_FILE": str(self.job_file)}
        with (self.log_dir / f"worker-{rank}.log").open("ab") as log:
            self.procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "mlless", "worker"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

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


class ExternalLauncher(Launcher):
    """Workers started by someone else (the operator's function backend); nothing to do here."""

    def start(self, rank: int) -> None:
        pass

    def exited(self) -> list[int]:
        return []

    def stop(self, rank: int) -> None:
        pass

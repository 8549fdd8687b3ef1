"""A plugin (MLLESS_PLUGINS) that records each worker's environment, and the helpers that read what it recorded.

A worker forked from a zygote (launch/zygote.py) holds its environment in its memory only: its /proc/PID/environ
shows the zygote's start environment. Loaded in every worker (plugins load in the worker, from its own environment),
this writes what the worker holds, with its pid, parent, session and directory, to RUNDIR.env/PID.json (beside the run
directory, whose files must not hold an identity), readable by its owner only, as /proc/PID/environ is, and which
slow imports it found done (a zygote's, for its model type). The
supervisor, which loads plugins too, has no rank and records nothing.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: Modules a zygote may have imported for a worker before it forked it (`ModelType.imports`).
PRELOADABLE = ("torch", "torchvision.models")

def folder(run_dir: Path) -> Path:
    return run_dir.with_name(f"{run_dir.name}.env")


def record() -> None:
    into = folder(Path(os.environ["MLLESS_JOB_FILE"]).parent)
    into.mkdir(exist_ok=True)
    pid = os.getpid()
    entry = {"pid": pid, "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(), "environ": dict(os.environ),
             "proc_environ": Path("/proc/self/environ").read_text(),
             "preloaded": [name for name in PRELOADABLE if name in sys.modules]}  # the worker imports its model later
    tmp = into / f".{pid}.json"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        json.dump(entry, fh)
    tmp.rename(into / f"{pid}.json")  # whole or not there, for a test reading it while the job runs


def recorded(run_dir: Path) -> list[dict]:
    """What each worker of the run in `run_dir` recorded, by rank."""
    entries = [json.loads(p.read_text()) for p in folder(run_dir).glob("[0-9]*.json")]
    return sorted(entries, key=lambda e: int(e["environ"]["MLLESS_RANK"]))


def worker_environ(run_dir: Path, pid: int) -> dict[str, str]:
    """The environment worker `pid` of the run in `run_dir` holds."""
    return json.loads((folder(run_dir) / f"{pid}.json").read_text())["environ"]


if "MLLESS_RANK" in os.environ and "MLLESS_JOB_FILE" in os.environ:
    record()

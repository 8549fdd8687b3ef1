"""Local workers as forks of a warm process (a zygote, as multiprocessing's forkserver), not new interpreters.

Python's start and mlless's imports are ~0.5 s of every `python -m mlless worker`, billed to the job. A zygote
(`python -m mlless zygote FD`, started by `Zygote`) imports what a worker runs once, then forks a child per request
of its parent over a Unix socket, which becomes what `python -m mlless worker` would be: its own session, stdin
from /dev/null, stdout and stderr to its log, its own environment and directory, default signal handling,
`mlless.cli.main(["worker"])`, the interpreter's exit. What a fork could share with the zygote, and a new process
would not, is kept apart as docs/architecture.md ("Worker processes") says. The zygote reaps its children and
reports each exit; it ends once its parent closes the socket (or dies) and its last child has ended: workers
outlive a killed supervisor, as processes of their own would. Its start is billed once, to the first worker forked
from it (`Zygote.spawn`).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mlless.contract import ENV_IDENTITY

#: How long a start waits for the zygote's imports (a loaded machine's first start takes seconds).
READY_TIMEOUT = 120.0
#: How long `close` waits for the zygote to end before killing it.
CLOSE_TIMEOUT = 10.0
MAX_MESSAGE = 4096


class ZygoteError(RuntimeError):
    """The zygote could not start a worker (it ended, or the fork failed)."""


def _send(channel: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(channel, [json.dumps(message).encode()], fds or [])


# ---- the parent's side ---------------------------------------------------------------------------------------


class Zygote:
    """A zygote process and its socket; thread-safe (a sweep's trials start workers from their own threads)."""

    def __init__(self, imports: Sequence[str] = ()) -> None:
        """`imports`: modules the zygote imports besides a worker's own, once for every fork (`ModelType.imports`)."""
        self.env = _start_env(os.environ)
        self.launched = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            # Its own session, as each worker's: a terminal's Ctrl-C reaches only the supervisor, which ends the job.
            self.proc = subprocess.Popen([sys.executable, "-m", "mlless", "zygote", str(theirs.fileno()),
                                          *(["--import", ",".join(imports)] if imports else [])],
                                         env=self.env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        self._channel = ours
        self._requests = threading.Lock()  # one request, and its reply, at a time
        self._state = threading.Condition()  # what the reader thread takes in: readiness, exits, the end
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._spawned: set[int] = set()
        self._ready_at: float | None = None
        self._ended = False
        self._charged = False
        self._reader = threading.Thread(target=self._read, name="mlless-zygote", daemon=True)
        self._reader.start()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serves(self, environ: Mapping[str, str]) -> bool:
        """Whether the workers of a process whose environment is `environ` can be forked: it is still the one the
        zygote started with."""
        return not self._ended and _start_env(environ) == self.env

    def spawn(self, env: dict[str, str], log_fd: int) -> tuple[int, float]:
        """Fork a worker with environment `env`, stdout and stderr to `log_fd`: its pid, and the seconds of the
        zygote's start billed to it (`Launcher.start`). The first worker is billed from the zygote's launch until it
        was ready, less what it waited for that itself; another that waited for it too is not billed its wait (-the
        wait): two trials of a sweep starting together paid the start twice. ZygoteError if it could not be forked."""
        asked = time.monotonic()
        with self._requests:
            with self._state:
                self._state.wait_for(lambda: self._ready_at is not None or self._ended, READY_TIMEOUT)
                if self._ready_at is None:
                    raise ZygoteError("the zygote did not start")
                ready_at = self._ready_at
            env_fd = os.memfd_create("mlless-worker-env", os.MFD_CLOEXEC)
            try:
                with open(env_fd, "wb", closefd=False) as fh:  # the directory too: the caller's, now
                    fh.write(json.dumps({"env": env, "cwd": os.getcwd()}).encode())
                _send(self._channel, {"spawn": True}, [env_fd, log_fd])
            except OSError as exc:
                raise ZygoteError(f"the zygote is gone: {exc}") from None
            finally:
                os.close(env_fd)
            reply = self._replies.get()
            if "pid" not in reply:
                raise ZygoteError(reply["error"])
            with self._state:
                self._spawned.add(reply["pid"])
            charge = -max(0.0, ready_at - asked) if self._charged else max(0.0, min(ready_at, asked) - self.launched)
            self._charged = True
            return reply["pid"], charge

    def returncode(self, pid: int) -> int | None:
        """The exit code of a worker forked from here (-N: killed by signal N); None while it runs."""
        with self._state:
            if pid not in self._exits and self._ended and not _running(pid):
                self._exits[pid] = -signal.SIGKILL  # the zygote died, and init reaped its orphan: no code to tell
            return self._exits.get(pid)

    def wait(self, pid: int, timeout: float | None = None) -> int | None:
        """Its exit code once it has ended, or None after `timeout` seconds."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        with self._state:
            while (code := self.returncode(pid)) is None and time.monotonic() < deadline:
                # A report wakes this; a dead zygote's orphans are looked at twice a second.
                self._state.wait(min(0.5, deadline - time.monotonic()))
            return code

    def kill(self, pid: int) -> None:
        """SIGKILL a worker forked from here unless it has ended: the zygote, which reaps it, knows, so a pid
        reused since is never hit. Never waits for more than a message."""
        with self._requests, contextlib.suppress(OSError):
            _send(self._channel, {"kill": pid})
            return
        if self.returncode(pid) is None:  # the zygote is gone: its orphan, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill what still runs of the workers forked here (their jobs are over), then end the zygote."""
        with self._state:
            running = self._spawned - set(self._exits)
        for pid in running:
            self.kill(pid)
        with contextlib.suppress(OSError):  # else it is gone already
            self._channel.shutdown(socket.SHUT_WR)  # the zygote reads the end of its requests
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join()
        self._channel.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._channel.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            message = json.loads(data) if data else {"error": "the zygote ended"}
            with self._state:
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                elif "ready" in message:
                    self._ready_at = message["ready"]  # CLOCK_MONOTONIC: one clock for the whole machine
                else:
                    self._replies.put(message)
                self._ended = not data
                self._state.notify_all()
            if not data:
                return


def _start_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: this process's, less its own identity, which no worker may see (each worker's
    replaces it), and which would stay in every fork's memory and /proc/PID/environ."""
    return {name: value for name, value in environ.items() if name != ENV_IDENTITY}


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# ---- the zygote's side -----------------------------------------------------------------------------------------


def serve(fd: int, entry: Callable[[], int]) -> int:
    """The zygote's loop on the socket `fd`: for each request fork a child that runs `entry`, until the socket
    closes and the last child has ended. In the zygote's only thread."""
    channel = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    for end in (wake_r, wake_w):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_w)  # a child's end wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    gc.freeze()  # the imported objects stay shared with the children, not copied by their collections
    children: set[int] = set()
    listening = True
    _send(channel, {"ready": time.monotonic()})
    while listening or children:
        readable, _, _ = select.select([channel, wake_r] if listening else [wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, MAX_MESSAGE)
            _reap(channel if listening else None, children)
        if listening and channel in readable:
            try:
                data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 2)
            except OSError:
                data, fds = b"", []
            listening = bool(data)
            request = json.loads(data) if data else {}
            if request.get("kill") in children:  # not reaped yet, so the pid is still that child's
                os.kill(request["kill"], signal.SIGKILL)
            elif "spawn" in request:
                _spawn(channel, children, fds, entry, (fd, wake_r, wake_w))
    return 0


def _reap(channel: socket.socket | None, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        if channel is not None:
            with contextlib.suppress(OSError):
                _send(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _spawn(channel: socket.socket, children: set[int], fds: list[int], entry: Callable[[], int],
           zygote_fds: tuple[int, ...]) -> None:
    try:
        pid = os.fork()
    except OSError as exc:
        _send(channel, {"error": f"fork: {exc}"})
    else:
        if pid == 0:
            _child(entry, fds[0], fds[1], zygote_fds)
        children.add(pid)
        _send(channel, {"pid": pid})
    finally:
        for fd in fds:
            os.close(fd)


def _child(entry: Callable[[], int], env_fd: int, log_fd: int, zygote_fds: tuple[int, ...]) -> None:
    """In the fork: become a new `python -m mlless worker`, run `entry`, and exit as it would; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in zygote_fds:  # the socket too: a worker must not speak for the zygote
            os.close(fd)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.lseek(env_fd, 0, os.SEEK_SET)
        with open(env_fd, "rb") as fh:
            start = json.loads(fh.read())
        os.chdir(start["cwd"])
        os.environ.clear()
        os.environ.update(start["env"])
        for handler in logging.root.handlers[:]:  # the worker configures logging as a new process does
            logging.root.removeHandler(handler)
        import numpy as np

        np.random.seed()
        sys.argv = ["mlless", "worker"]
        code = entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:  # what an interpreter does at its exit: wait for its threads, run atexit, flush
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

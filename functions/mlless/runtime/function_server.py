"""`mlless worker-server`: the HTTP function a Knative or OpenFaaS worker container runs.

One invocation (POST / or /invoke) runs one worker rank as a child process,
`mlless worker`, until the job ends for that rank or until shortly before
the platform's request timeout; then the worker checkpoints to Redis and the
response says "checkpointed", so the supervisor invokes the rank again: a
function's time limit is shorter than a training job. A child process rather than a thread keeps the worker exactly
what the pod backend and `mlless train` run, with its own signal handling.

Request (JSON): {"rank": int, "jobId": str, "job": {resolved job}, "resume": bool, "deadlineSeconds": number}
Response (JSON): {"rank": int, "status": "finished" | "checkpointed" | "failed", "exitCode": int, "seconds": number}
"finished" means the job ended for this rank (it finished or left). A
server already running `concurrency` invocations answers 429, so the caller
retries elsewhere. A function URL is reachable from the whole cluster, so
when the job has an invocation token (MLLESS_INVOKE_TOKEN, or the file
`invoke-token` OpenFaaS mounts) a request without `Authorization: Bearer
<token>` gets 401. The request carries no other secret: Redis and RabbitMQ
URLs come from the container's environment, or from the files OpenFaaS
mounts under MLLESS_SECRETS_DIR.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping

from mlless.contract import ENV_DEADLINE_SECONDS, ENV_JOB_FILE, ENV_JOB_ID, ENV_RANK, ENV_RESUME, EXIT_CHECKPOINTED
from mlless.protocol.framing import MAX_RANK
from mlless.runtime import json_object
from mlless.plugins import load_plugins
from mlless.spec import SpecError, TrainingJob
from mlless.transport.base import TransportError, check_job_id
from mlless.transport.credentials import invoke_token, service_urls

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # a resolved job is a few kB
#: Open connections served at once. The platform sends one invocation at a time plus health probes, so a
#: handful is plenty. Beyond it a new connection takes the place of the oldest one still sending its request
#: (a slow or stalled client), or is closed at once if every open one is running an invocation.
MAX_CONNECTIONS = 16
#: A request's line, headers and body must arrive within this, whatever the pace of single reads: a client that
#: sends a byte a second never trips a per-read timeout (slowloris), and would keep its connection for ever.
REQUEST_SECONDS = 10.0
#: The longest invocation deadline a request may ask for: a day, beyond any function platform's timeout.
MAX_DEADLINE_SECONDS = 86400.0


class InvocationError(ValueError):
    """A malformed invocation; the message names the field."""


@dataclass(frozen=True)
class Invocation:
    rank: int
    job_id: str
    job: TrainingJob
    resume: bool
    deadline_seconds: float | None

    @classmethod
    def parse(cls, body: bytes, expected_job_id: str | None) -> Invocation:
        try:
            doc = json_object(body)
        except ValueError as exc:
            raise InvocationError(f"body is {exc}") from None
        rank = doc.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK:
            raise InvocationError(f"rank must be an integer from 0 to {MAX_RANK}")
        job_id = doc.get("jobId")
        try:
            check_job_id(job_id)
        except (TypeError, ValueError) as exc:
            raise InvocationError(f"jobId: {exc}") from None
        if expected_job_id and job_id != expected_job_id:
            raise InvocationError(f"jobId {job_id!r} is not this function's job ({expected_job_id!r})")
        if not isinstance(doc.get("job"), dict):
            raise InvocationError("job must be the resolved TrainingJob object")
        try:
            job = TrainingJob.from_json(json.dumps(doc["job"]))
        except (SpecError, ValueError, TypeError, KeyError) as exc:
            raise InvocationError(f"job: not a resolved TrainingJob: {exc}") from None
        deadline = doc.get("deadlineSeconds")
        if deadline is not None and (not isinstance(deadline, (int, float)) or isinstance(deadline, bool)
                                     or not 0 < deadline <= MAX_DEADLINE_SECONDS):  # NaN fails the comparison too
            raise InvocationError(f"deadlineSeconds must be a number > 0 and <= {MAX_DEADLINE_SECONDS:g}")
        resume = doc.get("resume", False)
        if not isinstance(resume, bool):
            raise InvocationError("resume must be true or false")
        return cls(rank, job_id, job, resume, None if deadline is None else float(deadline))


class FunctionServer(ThreadingHTTPServer):
    """Runs at most `concurrency` invocations at a time, each a `mlless worker` child process."""

    daemon_threads = True
    # socketserver's default listen backlog is 5: during a flood of connections a health probe's SYN found the
    # queue full, was dropped, and was answered only after the client's 1 s SYN retransmission.
    request_queue_size = 128

    def __init__(
        self, port: int, services: Mapping[str, str], job_id: str | None = None, concurrency: int = 1,
        token: str | None = None, host: str = "",
    ) -> None:
        super().__init__((host, port), _Handler)
        self.services = dict(services)
        self.job_id = job_id
        self.token = token
        self.concurrency = concurrency
        self.slots = threading.BoundedSemaphore(concurrency)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.guard = threading.Lock()
        self.open = 0  # connections with a thread
        self.reading: dict[socket.socket, float] = {}  # connections still sending a request: since when

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.guard:
            if self.open >= MAX_CONNECTIONS:
                if not self.reading:
                    log.warning("refusing a connection from %s: %d invocations running", client_address[0], self.open)
                    self.shutdown_request(request)
                    return
                self._cut(min(self.reading, key=self.reading.__getitem__), "gave way to a new connection")
            self.open += 1
            self.reading[request] = time.monotonic()
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.guard:
                self.open -= 1
                self.reading.pop(request, None)

    def awaiting_request(self, connection: socket.socket, reading: bool) -> None:
        """`connection` starts waiting for a request (again, on a kept-alive connection), or has read one."""
        with self.guard:
            if reading:
                self.reading[connection] = time.monotonic()
            else:
                self.reading.pop(connection, None)

    def service_actions(self) -> None:
        """Between accepts (every poll interval): cut connections whose request is overdue (REQUEST_SECONDS)."""
        with self.guard:
            now = time.monotonic()
            for connection in [c for c, since in self.reading.items() if now - since > REQUEST_SECONDS]:
                self._cut(connection, f"sent no whole request in {REQUEST_SECONDS:g}s")

    def _cut(self, connection: socket.socket, why: str) -> None:
        """Shut `connection` down (its thread's read ends at once); called holding the guard."""
        self.reading.pop(connection, None)
        log.warning("closing a connection that %s", why)
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the client

    def invoke(self, inv: Invocation) -> dict[str, Any]:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mlless-invocation-") as tmp:
            job_file = Path(tmp) / "job.json"
            job_file.write_text(inv.job.to_json())
            env = {
                **os.environ,
                **self.services,
                ENV_JOB_FILE: str(job_file),
                ENV_JOB_ID: inv.job_id,
                ENV_RANK: str(inv.rank),
                ENV_RESUME: "1" if inv.resume else "0",
            }
            env.pop(ENV_DEADLINE_SECONDS, None)
            if inv.deadline_seconds is not None:
                env[ENV_DEADLINE_SECONDS] = repr(inv.deadline_seconds)
            child = subprocess.Popen([sys.executable, "-m", "mlless", "worker"], env=env, stdin=subprocess.DEVNULL)
            with self.lock:
                self.children[child.pid] = child
            try:
                code = child.wait()
            finally:
                with self.lock:
                    self.children.pop(child.pid, None)
        status = "finished" if code == 0 else "checkpointed" if code == EXIT_CHECKPOINTED else "failed"
        log.info("rank %d: invocation %s (exit code %d)", inv.rank, status, code)
        return {"rank": inv.rank, "status": status, "exitCode": code, "seconds": round(time.monotonic() - started, 3)}

    def terminate_children(self, grace: float) -> None:
        """Platform shutdown (SIGTERM): each running worker leaves gracefully, handing on its unsent updates."""
        self.stopping = True
        with self.lock:
            children = list(self.children.values())
        for child in children:
            child.terminate()
        deadline = time.monotonic() + grace
        for child in children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        # Each handler releases its slot once its response is written; holding all slots means none is left unanswered.
        for _ in range(self.concurrency):
            self.slots.acquire(timeout=5.0)


class _Handler(BaseHTTPRequestHandler):
    server: FunctionServer
    protocol_version = "HTTP/1.1"
    # Seconds a socket read or write may stall: a client that opens a connection and sends nothing must not pin a
    # thread for ever.  (An invocation itself runs much longer; that is processing time, not a stalled socket.)
    timeout = 30.0

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def handle_one_request(self) -> None:
        self.server.awaiting_request(self.connection, True)
        super().handle_one_request()

    def _reply(self, status: HTTPStatus, doc: Mapping[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            # What is left of the request (an unread body) must never be read as the next request.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.awaiting_request(self.connection, False)
        if self.path in ("/healthz", "/_/health", "/_/ready"):
            self._reply(HTTPStatus.OK, {"status": "ok"})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})

    def do_POST(self) -> None:
        if self.path not in ("/", "/invoke"):
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}; POST / to invoke"})
            return
        if self.server.token is not None:
            scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
            if scheme != "Bearer" or not hmac.compare_digest(given.encode(), self.server.token.encode()):
                self._reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong invocation token (Authorization: Bearer ...)"})
                return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length <= 0 or length > MAX_BODY:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"body must be 1 to {MAX_BODY} bytes of JSON"})
            return
        body = self.rfile.read(length)
        self.server.awaiting_request(self.connection, False)
        try:
            inv = Invocation.parse(body, self.server.job_id)
        except InvocationError as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        if self.server.stopping or not self.server.slots.acquire(blocking=False):
            self._reply(HTTPStatus.TOO_MANY_REQUESTS, {"error": "busy: this function runs one invocation at a time"})
            return
        try:
            self._reply(HTTPStatus.OK, self.server.invoke(inv))
        finally:
            self.server.slots.release()


def serve_functions(port: int, concurrency: int = 1, grace: float = 50.0, host: str = "") -> int:
    """Serve until SIGTERM or Ctrl-C; running workers leave gracefully first. The process's exit code."""
    load_plugins()  # an invocation's job may name a sync strategy or model type MLLESS_PLUGINS registers
    services = service_urls(os.environ)
    if len(services) < 2:
        raise TransportError("the worker server needs REDIS_URL and AMQP_URL (environment, or files in MLLESS_SECRETS_DIR)")
    server = FunctionServer(port, services, os.environ.get(ENV_JOB_ID) or None, concurrency, invoke_token(os.environ),
                            host)

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever, so it must run off the signal handler's thread.
        threading.Thread(target=lambda: (server.terminate_children(grace), server.shutdown()), daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("worker function listening on :%d", server.server_address[1])
    print(f"mlless worker-server listening on port {server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0

"""Private service instances for fault tests: they are stopped, restarted and cut off, so never the shared ones.

A second RabbitMQ node runs beside the system's, on its own ports, directories and node name. Starting one
takes about 10 s, so a module shares it; each test leaves it running and empty.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SBIN = "/usr/sbin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


@dataclass
class RabbitNode:
    """A RabbitMQ node of this test module's own."""

    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def ctl(self, *args: str) -> str:
        return subprocess.run([shutil.which("rabbitmqctl", path=f"{SBIN}:{os.environ['PATH']}"), "-n",
                               self.env["RABBITMQ_NODENAME"], *args], env=self.env, check=True, capture_output=True,
                              text=True, timeout=60).stdout

    def wait_until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _accepts(self.port):
            if time.monotonic() > deadline:
                logs = "".join(p.read_text(errors="replace")[-2000:] for p in Path(self.env["RABBITMQ_LOG_BASE"]).glob("*.log"))
                raise RuntimeError(f"the private RabbitMQ node did not listen on {self.port} in {timeout:g}s:\n{logs}")
            time.sleep(0.2)

    def queues(self) -> list[str]:
        out = self.ctl("list_queues", "--quiet", "--no-table-headers", "name")
        return [line.strip() for line in out.splitlines() if line.strip()]


@contextmanager
def rabbit_node(conf: str = "listeners.tcp.local = 127.0.0.1:{port}") -> Iterator[RabbitNode]:
    """A private node whose rabbitmq.conf is `conf` with its port filled in (e.g. a TLS listener and its
    ssl_options); stopped and removed on exit."""
    server = shutil.which("rabbitmq-server", path=f"{SBIN}:{os.environ['PATH']}")
    if server is None:
        pytest.fail("rabbitmq-server is not installed (.ci/run installs it)")
    # Not under pytest's tmp_path: its folders are private to root, and the server runs as the rabbitmq user.
    base = Path(tempfile.mkdtemp(prefix="mlless-rabbitmq-"))
    base.chmod(0o755)
    port, dist = free_port(), free_port()
    (base / "rabbitmq.conf").write_text(conf.format(port=port) + "\n")
    (base / "enabled_plugins").write_text("[].\n")
    for sub in ("mnesia", "log"):
        (base / sub).mkdir()
    if os.geteuid() == 0:  # the server drops to the rabbitmq user, which must own its files
        account = pwd.getpwnam("rabbitmq")
        for path in [base, *base.rglob("*")]:
            os.chown(path, account.pw_uid, account.pw_gid)
    name = f"faults{port}@localhost"
    env = {**os.environ, "RABBITMQ_NODENAME": name, "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"), "RABBITMQ_NODE_PORT": str(port),
           "RABBITMQ_DIST_PORT": str(dist), "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
           "RABBITMQ_LOG_BASE": str(base / "log"), "PATH": f"{SBIN}:{os.environ['PATH']}"}
    subprocess.run([server, "-detached"], env=env, check=True, capture_output=True, timeout=60)
    node = RabbitNode(port, env)
    try:
        node.wait_until_up()
        yield node
    finally:
        subprocess.run([shutil.which("rabbitmqctl", path=env["PATH"]), "-n", name, "stop"], env=env,
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitNode]:
    with rabbit_node() as node:
        yield node


@contextmanager
def redis_server(*args: str, port_option: str = "--port", port: int | None = None) -> Iterator[int]:
    """A Redis without persistence listening on `port` (default: a free one) given with `port_option` (`--tls-port`
    for TLS, with `--port 0` in `args`), started with `args` besides; yields the port. Stopped through its pid file,
    as the caller may have shut it down already."""
    port = port or free_port()
    base = Path(tempfile.mkdtemp(prefix="mlless-redis-"))
    pidfile = base / "redis.pid"
    subprocess.run(["redis-server", port_option, str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--daemonize", "yes", "--dir", str(base), "--pidfile", str(pidfile),
                    "--logfile", str(base / "redis.log"), *args], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not (_accepts(port) and pidfile.exists() and pidfile.read_text().strip()):  # it may listen before it writes it
        assert time.monotonic() < deadline, f"the private Redis did not listen on {port}"
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    try:
        yield port
    finally:
        try:
            if "redis-server" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):  # not a reused pid
                os.kill(pid, signal.SIGTERM)
        except (FileNotFoundError, ProcessLookupError):
            pass  # shut down by the test already
        stop_by = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < stop_by:
            time.sleep(0.05)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def private_redis() -> Iterator[str]:
    """A Redis of this test's own, without persistence, on a free port; yields its URL. The test may shut it down."""
    with redis_server() as port:
        yield f"redis://127.0.0.1:{port}/0"

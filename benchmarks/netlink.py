"""A rate-limited link for the benchmarks: Redis and RabbitMQ in a network namespace of their own.

On one machine every byte between a worker and Redis or RabbitMQ goes over loopback, which costs next to
nothing; on a cluster it crosses a NIC. `limited_link(rate)` puts a private Redis and a private RabbitMQ
node in a new network namespace, reached from the host over a veth pair whose two ends each have a `tbf`
qdisc, so both directions are limited to `rate`. Only bandwidth is limited: this kernel has `tbf` but not
`netem`, so there is no added delay. Only addresses inside that pair are used, never the shared services.

    with limited_link("1gbit") as link:        # or "200mbit", or None: loopback and the shared services
        run(..., "--redis-url", link.redis_url, "--amqp-url", link.amqp_url)
        subprocess.run([*link.exec_prefix, sys.executable, "rank.py"])   # a process whose traffic crosses too

A benchmark covers both settings with

    for rate in (None, "1gbit", "200mbit"):
        try:
            with limited_link(rate) as link:
                rows.append(measure(link))
        except LinkUnavailable as e:   # raised before anything runs, never from the body
            print(e)                   # one line: why, and that the limited-link rows are skipped
            break

Needs root, iproute2 (`ip`, `tc`), redis-server and rabbitmq-server. Everything is removed on exit,
also on an exception or Ctrl-C; namespaces that a killed run left behind (`mlless-bench-PID-N` whose PID
is gone) are removed by the next run, or by `--clean`.

    python -m benchmarks.netlink --rate 200mbit --check     # measured Mbit/s both ways against the rate
    python -m benchmarks.netlink --check                    # loopback, 1gbit and 200mbit in one table
    python -m benchmarks.netlink --rate 1gbit               # keep a link up until Ctrl-C, for manual runs
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import ipaddress
import itertools
import json
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from . import _common

PREFIX = "mlless-bench-"
SBIN = "/usr/sbin"  # where rabbitmq-server lives, which is not on every user's PATH
# /30 subnets for the veth pairs come from here, skipping any that overlaps an address or route of the host.
POOL = ipaddress.ip_network("10.213.0.0/16")
LOCK = Path(tempfile.gettempdir()) / "mlless-netlink.lock"
# The namespace has a port space of its own, so its services take the standard ports, as on a cluster.
REDIS_PORT, AMQP_PORT = 6379, 5672
NETNS_DEV = "eth0"

# tbf refills its bucket when its watchdog timer fires, and tokens beyond `burst` are lost: a timer that
# fires d seconds late costs rate * d of sending time unless burst >= rate * d. tc-tbf(8) asks for
# burst >= rate / HZ (HZ = 250 on this kernel, 4 ms). Besides, veth hands tbf 64 KiB GSO packets, and tbf
# splits a packet larger than its bucket into MTU-sized ones, each waiting for its own tokens. Measured here
# (2 shared cores, TCP at 1 Gbit/s): a 64 KiB bucket gave 690 Mbit/s, 128 KiB 953, 500 KB 959; at
# 200 Mbit/s 16 KiB already gave 190. So burst = max(rate * 4 ms, 2 x 64 KiB): 500 KB at 1 Gbit/s,
# 128 KiB at 200 Mbit/s. A larger bucket would let whole messages after an idle gap through unshaped.
BUCKET_SECONDS = 0.004
MIN_BURST = 2 * 65536
# The queue in front of the bucket holds what a Linux NIC's transmit queue does by default (txqueuelen 1000
# full-size packets): 12 ms at 1 Gbit/s, 61 ms at 200 Mbit/s. Small messages queue behind bulk transfers
# there, as on a shared NIC. A 5 ms queue (125 KB at 200 Mbit/s) dropped ~1 % of the packets of two workers'
# updates, and the TCP retransmission timeouts cost a third of the steps of a P = 2 job (3.7 against 5.6 steps/s).
QUEUE_BYTES = 1000 * 1514

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}  # tc's: decimal multiples
_serial = itertools.count()
_open: set[str] = set()  # this process's links, which the sweep must not take for a dead run's


class LinkUnavailable(RuntimeError):
    """This machine cannot make the link (not root, no iproute2, EPERM, no tbf); str() is one line to print."""

    def __init__(self, why: str) -> None:
        super().__init__(f"no rate-limited link here ({why}): the limited-link rows are skipped, loopback only")


@dataclass(frozen=True)
class Link:
    """Where the services of one setting are. For loopback `netns` is None and both addresses are 127.0.0.1."""

    rate: str | None
    redis_url: str
    amqp_url: str
    description: str  # for RESULTS tables
    host_addr: str  # the host's end of the veth pair: how a process in the namespace reaches the host
    netns_addr: str  # the namespace's end, where its services listen
    netns: str | None = None
    host_dev: str | None = None
    netns_dev: str | None = None

    @property
    def exec_prefix(self) -> list[str]:
        """Prepended to a command to run it inside the namespace (nothing for loopback)."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate such as "200mbit"."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", rate.strip().lower())
    if m is None:
        raise ValueError(f"rate {rate!r}: expected a number followed by bit, kbit, mbit or gbit, e.g. 200mbit")
    return int(float(m[1]) * _RATE_UNITS[m[2]])


def rate_label(bits: int) -> str:
    for unit, scale in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits} bit/s"


def burst_bytes(bits: int) -> int:
    return max(int(bits / 8 * BUCKET_SECONDS), MIN_BURST)


def _tool(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SBIN}")


def _run(*cmd: str) -> str:
    """Run a command (iproute2's mostly), raising with its stderr when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return done.stdout


def _error(e: subprocess.CalledProcessError) -> str:
    return f"`{' '.join(e.cmd)}`: {(e.stderr or '').strip() or f'exit status {e.returncode}'}"


def _accepts(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), 0.5).close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- namespaces

def netns_names() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def netns_pids(name: str) -> list[int]:
    try:
        return [int(p) for p in _run("ip", "netns", "pids", name).split()]
    except subprocess.CalledProcessError:
        return []  # already gone


def _host_dev(name: str) -> str:
    """The host end of `name`'s veth pair: "mlb-PID-N", within the 15 characters of an interface name."""
    return "mlb-" + name.removeprefix(PREFIX)


def _remove(name: str) -> None:
    """Stop every process inside the namespace, then delete the veth pair and the namespace.

    Killing what runs in the namespace covers Redis, the RabbitMQ node and its epmd, and whatever the caller
    started there, and it works the same for a killed run's leftovers. A namespace with a process still in it
    would outlive `ip netns del`, unseen. The services' data is thrown away, so SIGTERM (on which Redis and
    Erlang shut down in about a second) is enough politeness, with SIGKILL for anything still there after 10 s.
    """
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = netns_pids(name)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and netns_pids(name) and time.monotonic() < deadline:
            time.sleep(0.1)
    # Deleting the namespace destroys the pair too, but only once the kernel frees it, a little later;
    # deleting the host end first makes it go now.
    for cmd in (("ip", "link", "del", _host_dev(name)), ("ip", "netns", "del", name)):
        subprocess.run(cmd, capture_output=True, timeout=60)
    for leftover in Path(tempfile.gettempdir()).glob(f"{name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Remove `mlless-bench-PID-N` namespaces whose PID is not running (a killed run's); report those whose PID
    is running in another process, which may be a run in progress. Returns the names removed."""
    removed = []
    for name in netns_names():
        m = re.fullmatch(re.escape(PREFIX) + r"(\d+)-\d+", name)
        if m is None:
            continue
        pid = int(m[1])
        if name in _open:  # this process's own, still in use
            continue
        if pid != os.getpid() and Path(f"/proc/{pid}").exists():
            print(f"netlink: netns {name} belongs to running pid {pid}: left alone (if that is not a benchmark, "
                  f"remove it with `python -m benchmarks.netlink --clean --force {name}`)", file=sys.stderr)
            continue
        _remove(name)
        removed.append(name)
        print(f"netlink: removed netns {name}, left by pid {pid} which is gone", file=sys.stderr)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for a in json.loads(_run("ip", "-j", "-4", "addr", "show")):
        for info in a.get("addr_info", []):
            nets.append(ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network)
    for r in json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all")):
        if r.get("dst", "default") != "default":
            nets.append(ipaddress.ip_network(r["dst"], strict=False))
    return nets


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    for net in POOL.subnets(new_prefix=30):
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(f"no /30 of {POOL} is free on this host")


@contextmanager
def _address_lock() -> Iterator[None]:
    """Serialises picking a subnet and assigning it, so that two runs starting at once pick different ones."""
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def unavailable() -> str | None:
    """Why this machine cannot make the link, before trying; None when it may."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]  # run by name, as exec_prefix is
    missing += [t for t in ("redis-server", "rabbitmq-server") if _tool(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed"
    return None


def _make_link(name: str, bits: int) -> tuple[str, str]:
    """The namespace, the veth pair with addresses and tbf on both ends; returns (host_addr, netns_addr)."""
    host_dev = _host_dev(name)
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as e:
        raise LinkUnavailable(_error(e)) from None
    with _address_lock():
        host, peer = list(_free_subnet().hosts())
        # The namespace's end is made inside it (named like a node's NIC), so no name is taken on the host.
        _run("ip", "link", "add", host_dev, "type", "veth", "peer", "name", NETNS_DEV, "netns", name)
        _run("ip", "addr", "add", f"{host}/30", "dev", host_dev)
    _run("ip", "link", "set", host_dev, "up")
    _run("ip", "-n", name, "addr", "add", f"{peer}/30", "dev", NETNS_DEV)
    _run("ip", "-n", name, "link", "set", NETNS_DEV, "up")
    _run("ip", "-n", name, "link", "set", "lo", "up")  # the RabbitMQ node registers with its epmd over it
    # GSO/TSO stay on (no ethtool here, and none needed): tbf charges a GSO packet for every segment's
    # headers, and TCP through it measured 955 Mbit/s at 1 Gbit/s: 1448 bytes of payload in every 1514-byte
    # frame. A real wire also carries preamble, FCS and gap, so its TCP goodput is 941 Mbit/s: the link is
    # 1.5 % generous.
    tbf = ("root", "tbf", "rate", f"{bits}bit", "burst", str(burst_bytes(bits)), "limit", str(QUEUE_BYTES))
    try:
        _run("tc", "qdisc", "add", "dev", host_dev, *tbf)
        _run("tc", "-n", name, "qdisc", "add", "dev", NETNS_DEV, *tbf)
    except subprocess.CalledProcessError as e:
        raise LinkUnavailable(_error(e)) from None
    return str(host), str(peer)


# ---------------------------------------------------------------------------------------------- services

def _start_redis(prefix: list[str], addr: str, base: Path) -> subprocess.Popen:
    # Protected mode would refuse the clients: they come over the link, never from the namespace's loopback.
    # A new session keeps a Ctrl-C at the terminal from stopping the servers before the teardown does.
    return subprocess.Popen([*prefix, _tool("redis-server"), "--bind", addr, "--port", str(REDIS_PORT),
                             "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", str(base),
                             "--logfile", str(base / "redis.log")],
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _start_rabbitmq(prefix: list[str], name: str, addr: str, base: Path) -> None:
    """A node of the namespace's own, as tests/faults/conftest.py makes one (which benchmarks do not import):
    its own config, mnesia and log directories, owned by the rabbitmq user the server drops to."""
    home = base / "rabbitmq"
    for sub in ("mnesia", "log"):
        (home / sub).mkdir(parents=True)
    # guest may log in only over loopback by default, and the clients come over the link.
    (home / "rabbitmq.conf").write_text(f"listeners.tcp.1 = {addr}:{AMQP_PORT}\nloopback_users.guest = false\n")
    (home / "enabled_plugins").write_text("[].\n")
    account = pwd.getpwnam("rabbitmq")
    for path in [base, *base.rglob("*")]:
        os.chown(path, account.pw_uid, account.pw_gid)
    env = {**os.environ, "RABBITMQ_NODENAME": f"{name}@localhost",
           "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
           "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
           "PATH": f"{os.environ.get('PATH', '')}:{SBIN}"}
    subprocess.run([*prefix, _tool("rabbitmq-server"), "-detached"], env=env, check=True, capture_output=True,
                   timeout=60, start_new_session=True)


def _wait_for_services(addr: str, redis_server: subprocess.Popen, base: Path, ports: tuple[int, ...],
                       timeout: float = 120.0) -> None:
    """Until every one of `ports` accepts connections from the host, through the link (RabbitMQ takes 6-15 s here)."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while not _accepts(addr, port):
            if redis_server.poll() is not None or time.monotonic() > deadline:
                logs = "".join(f"\n--- {p}\n" + p.read_text(errors="replace")[-2000:] for p in base.rglob("*.log"))
                raise RuntimeError(f"{'redis-server exited' if redis_server.poll() is not None else 'timed out'} "
                                   f"before {addr}:{port} accepted connections{logs}")
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- the link

@contextmanager
def limited_link(rate: str | None, rabbitmq: bool = True) -> Iterator[Link]:
    """A namespace with its own Redis and RabbitMQ, reached over a veth pair limited to `rate` each way
    ("1gbit", "200mbit"); None: loopback and the shared services. Raises LinkUnavailable before anything
    runs where the link cannot be made. Everything is removed on exit, including processes the caller
    started inside the namespace. `rabbitmq=False`: Redis only (a further Redis shard behind a link of its own,
    the exchange suite's sharding); the link's `amqp_url` is then empty."""
    if rate is None:
        yield Link(None, _common.REDIS, _common.AMQP, "loopback, shared services", "127.0.0.1", "127.0.0.1")
        return
    bits = rate_bits(rate)
    why = unavailable()
    if why is not None:
        raise LinkUnavailable(why)
    sweep_stale()
    name = f"{PREFIX}{os.getpid()}-{next(_serial)}"
    _open.add(name)
    redis_server: subprocess.Popen | None = None
    try:
        host_addr, netns_addr = _make_link(name, bits)
        prefix = ["ip", "netns", "exec", name]
        base = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        base.chmod(0o755)  # the RabbitMQ node runs as the rabbitmq user
        if rabbitmq:
            _start_rabbitmq(prefix, name, netns_addr, base)  # first: it is the slow one
        redis_server = _start_redis(prefix, netns_addr, base)
        _wait_for_services(netns_addr, redis_server, base, (REDIS_PORT, AMQP_PORT) if rabbitmq else (REDIS_PORT,))
        yield Link(rate, f"redis://{netns_addr}:{REDIS_PORT}/0",
                   f"amqp://guest:guest@{netns_addr}:{AMQP_PORT}/%2F" if rabbitmq else "",
                   f"tbf {rate_label(bits)} each way, veth, netns {name}", host_addr, netns_addr, name,
                   _host_dev(name), NETNS_DEV)
    finally:
        _remove(name)
        if redis_server is not None:
            redis_server.wait()  # our child: reaped here (the others were detached and belong to init)
        _open.discard(name)


# ---------------------------------------------------------------------------------------------- --check

def _receive(c: socket.socket, nbytes: int) -> float:
    """Read `nbytes` and return the Mbit/s of the second half: the first passes the empty bucket and queue
    (1.1 MB at 1 Gbit/s) faster than the rate, and the receiver's clock is the one that sees the link."""
    got = 0
    while got < nbytes // 2:
        got += len(c.recv(1 << 20))
    started, rest = time.perf_counter(), 0
    while got + rest < nbytes:
        rest += len(c.recv(1 << 20))
    return _mbits(rest, time.perf_counter() - started)


def _send(c: socket.socket, nbytes: int) -> None:
    chunk = memoryview(bytes(1 << 20))
    for offset in range(0, nbytes, len(chunk)):
        c.sendall(chunk[:nbytes - offset])


def tcp_peer(addr: str, nbytes: int) -> None:
    """The far end of `measure_tcp`, run where the services are: on a free port, receives `nbytes` from the
    first connection and answers with the Mbit/s, then sends `nbytes` on the second."""
    with socket.create_server((addr, 0)) as s:
        print(s.getsockname()[1], flush=True)
        with s.accept()[0] as c:
            c.sendall(f"{_receive(c, nbytes)}".encode())
        with s.accept()[0] as c:
            _send(c, nbytes)


@dataclass
class Measured:
    """Mbit/s of payload each way (`up`: host to services) and the median Redis PING round trip."""

    tcp_up: float
    tcp_down: float
    redis_set: float
    redis_get: float
    ping_us: float


def _mbits(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e6


def measure_tcp(link: Link, nbytes: int) -> tuple[float, float]:
    """Raw TCP payload Mbit/s (up, down) between the host and a peer placed where the services are."""
    run_peer = f"import sys; sys.path.insert(0, {str(_common.ROOT)!r}); from benchmarks import netlink; " \
               f"netlink.tcp_peer({link.netns_addr!r}, {nbytes})"
    peer = subprocess.Popen([*link.exec_prefix, sys.executable, "-c", run_peer], stdout=subprocess.PIPE, text=True)
    try:
        port = int(peer.stdout.readline())
        with socket.create_connection((link.netns_addr, port)) as c:
            _send(c, nbytes)
            c.shutdown(socket.SHUT_WR)
            up = float(c.recv(100))
        with socket.create_connection((link.netns_addr, port)) as c:
            down = _receive(c, nbytes)
        peer.wait(30)
        return up, down
    finally:
        peer.kill()
        peer.wait()


def measure_redis(link: Link, nbytes: int, value_bytes: int = 4 << 20, pings: int = 200) -> tuple[float, float, float]:
    """(SET Mbit/s, GET Mbit/s, median PING µs) of `nbytes` in `value_bytes` values. On loopback this is the
    shared Redis: the keys are unique, expire within a minute and are deleted at the end."""
    r = redis.Redis.from_url(link.redis_url)
    key, value, count = f"mlless-netlink-check:{uuid.uuid4().hex}", bytes(value_bytes), max(1, nbytes // value_bytes)
    try:
        rtts = []
        for _ in range(pings):
            started = time.perf_counter()
            r.ping()
            rtts.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(count):
            r.set(key, value, px=60_000)
        put = _mbits(count * value_bytes, time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(count):
            assert len(r.get(key)) == value_bytes
        got = _mbits(count * value_bytes, time.perf_counter() - started)
        return put, got, statistics.median(rtts) * 1e6
    finally:
        r.delete(key)
        r.close()


def check(link: Link, nbytes: int) -> Measured:
    up, down = measure_tcp(link, nbytes)
    put, got, ping = measure_redis(link, nbytes)
    return Measured(up, down, put, got, ping)


def _cell(mbits: float, rate: str | None) -> str:
    return f"{mbits:,.0f}" + (f" ({mbits / rate_bits(rate) * 1e6:.0%})" if rate else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", nargs="+", default=["loopback", "1gbit", "200mbit"],
                   help="tc rates, or loopback for the shared services (default: loopback 1gbit 200mbit)")
    p.add_argument("--check", action="store_true",
                   help="measure TCP and Redis throughput each way and PING time, then tear down")
    p.add_argument("--megabytes", type=int, default=32, help="bytes each way per measurement (default 32 MB)")
    p.add_argument("--clean", action="store_true",
                   help="remove namespaces left by killed runs (and those named after --force) and exit")
    p.add_argument("--force", nargs="*", default=[], metavar="NETNS", help="with --clean: namespaces to remove")
    args = p.parse_args(argv)
    # Turn SIGTERM into an exception too, so that the links' teardown runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.clean:
        sweep_stale()
        for name in args.force:
            if not name.startswith(PREFIX):
                p.error(f"{name} is not a {PREFIX}* namespace")
            _remove(name)
            print(f"netlink: removed netns {name}")
        return 0
    rates = [None if r == "loopback" else r for r in args.rate]
    if not args.check:
        if len(rates) != 1:
            p.error("without --check, give one --rate to keep up")
        with limited_link(rates[0]) as link:
            print(json.dumps({**dataclasses.asdict(link), "exec_prefix": link.exec_prefix}, indent=2))
            print("up until Ctrl-C", flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
        return 0
    print(_common.machine_line())
    rows = []
    for rate in rates:
        try:
            with limited_link(rate) as link:
                print(f"{link.description}: {args.megabytes} MB each way ...", flush=True)
                m = check(link, args.megabytes << 20)
        except LinkUnavailable as e:
            print(e)
            break
        rows.append([link.description.split(",")[0], _cell(m.tcp_up, rate), _cell(m.tcp_down, rate),
                     _cell(m.redis_set, rate), _cell(m.redis_get, rate), round(m.ping_us)])
    print(_common.table(["link", "TCP to services, Mbit/s", "TCP from services", "Redis SET", "Redis GET",
                         "Redis PING, µs (median)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

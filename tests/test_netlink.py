"""The benchmarks' rate-limited link (benchmarks/netlink.py): it comes up, its Redis and RabbitMQ answer through
it and only through it, and nothing is left after it. Throughput is the benchmark's business (`--check`), not
asserted here. Skipped where network namespaces cannot be made (not root, no iproute2)."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pika
import pytest
import redis

# The benchmarks are a package at the repository's root (`python -m benchmarks`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import netlink  # noqa: E402


def _sent(link: netlink.Link) -> tuple[int, int]:
    """Bytes through the tbf qdiscs of the host's end and of the namespace's end of the link."""
    counts = []
    for netns, dev in (([], link.host_dev), (["-n", link.netns], link.netns_dev)):
        [qdisc] = json.loads(subprocess.run(["tc", *netns, "-s", "-j", "qdisc", "show", "dev", dev], check=True,
                                            capture_output=True, text=True).stdout)
        assert qdisc["kind"] == "tbf"
        counts.append(qdisc["bytes"])
    return counts[0], counts[1]


def _grew_both_ways(link: netlink.Link, before: tuple[int, int], nbytes: int) -> bool:
    return all(now - then >= nbytes for now, then in zip(_sent(link), before))


def _listeners(*prefix: str) -> list[str]:
    """`ss -ltnp` lines of the host, or of a namespace with `ip netns exec NAME` before it."""
    return subprocess.run([*prefix, "ss", "-Hltnp"], check=True, capture_output=True, text=True).stdout.splitlines()


def _running(pid: int) -> bool:
    """Alive and not a zombie: the RabbitMQ node detaches, so init reaps its processes, when it gets to it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_services_answer_through_the_link_and_nothing_is_left() -> None:
    value = bytes(range(256)) * 400  # 100 KB each way, which both ends' qdiscs must count
    try:
        with netlink.limited_link("200mbit") as link:
            name, host_dev, pids = link.netns, link.host_dev, netlink.netns_pids(link.netns)
            assert name in netlink.netns_names() and pids

            before = _sent(link)
            r = redis.Redis.from_url(link.redis_url, socket_timeout=10)
            assert r.ping()
            assert r.info("server")["process_id"] in pids  # the namespace's server, not the shared one
            r.set("netlink-test", value)
            assert r.get("netlink-test") == value
            r.close()
            assert _grew_both_ways(link, before, len(value))

            before = _sent(link)
            conn = pika.BlockingConnection(pika.URLParameters(link.amqp_url))
            ch = conn.channel()
            ch.queue_declare("netlink-test")
            ch.basic_publish("", "netlink-test", value)
            _, _, body = ch.basic_get("netlink-test", auto_ack=True)
            assert body == value
            conn.close()
            assert _grew_both_ways(link, before, len(value))

            # Inside, Redis and AMQP listen on the namespace's address alone; on the host, nothing of theirs.
            inside = {line.split()[3] for line in _listeners(*link.exec_prefix)
                      if re.search(rf":({netlink.REDIS_PORT}|{netlink.AMQP_PORT})\s", line)}
            assert inside == {f"{link.netns_addr}:{netlink.REDIS_PORT}", f"{link.netns_addr}:{netlink.AMQP_PORT}"}
            host_pids = {int(p) for line in _listeners() for p in re.findall(r"pid=(\d+)", line)}
            assert not host_pids & set(netlink.netns_pids(name))

            # A process run with exec_prefix (as a DDP rank would be) reaches the host's end of the link.
            with socket.create_server((link.host_addr, 0)) as server:
                reach = f"import socket; socket.create_connection(({link.host_addr!r}, {server.getsockname()[1]}), 10)"
                subprocess.run([*link.exec_prefix, sys.executable, "-c", reach], check=True, timeout=30)
                server.accept()[0].close()
    except netlink.LinkUnavailable as e:
        pytest.skip(str(e))

    assert name not in netlink.netns_names()
    assert subprocess.run(["ip", "link", "show", host_dev], capture_output=True).returncode != 0
    assert not [pid for pid in pids if _running(pid)]


def test_a_dead_runs_namespace_is_swept() -> None:
    if why := netlink.unavailable():
        pytest.skip(str(netlink.LinkUnavailable(why)))
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"{netlink.PREFIX}{gone.pid}-0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in netlink.sweep_stale()
    assert stale not in netlink.netns_names()


def test_unavailable_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netlink.os, "geteuid", lambda: 1000)
    with pytest.raises(netlink.LinkUnavailable, match=r"^no rate-limited link here \(not root[^\n]*loopback only$"):
        with netlink.limited_link("1gbit"):
            pass
    with netlink.limited_link(None) as link:  # loopback needs nothing
        assert (link.redis_url, link.exec_prefix) == ("redis://127.0.0.1:6379/0", [])

"""Transport over real services: Redis for bytes, RabbitMQ for control frames.

``ServicesTransport`` composes the two sides, each in its own module with its
client library's idioms and its own outage handling: ``JobStore``
(``mlless.transport.store``, redis-py) holds the job's keys (over several Redis shards,
``mlless.transport.shards``), ``JobBus``
(``mlless.transport.bus``, pika) its queues.  Either service out of reach is
waited out (``mlless.transport.outage``); the constructor connects to both, so
a wrong URL is reported at once.  The transport seals what it hands them and
unseals what they hand back (``mlless.transport.base``).  Deleting a job's keys
from outside the job is ``mlless.transport.admin``.
"""
from __future__ import annotations

from typing import Any, Sequence

from mlless.contract import shard_urls
from mlless.protocol.identity import Identity, Issuer
from .base import DEFAULT_TTL, Role, Transport, check_key
from .bus import JobBus
from .outage import CONNECT_SECONDS, outage_window
from .shards import ShardedStore
from .store import JobStore
from .tls import TrustedCA, ca_from_env

__all__ = ["ServicesTransport"]


class ServicesTransport(Transport):
    """Redis + RabbitMQ backend.  See ``mlless.transport.store`` and ``mlless.transport.bus`` for each side."""

    def __init__(
        self,
        job_id: str,
        *,
        redis_url: str,  # one URL, or the shards' separated by whitespace
        amqp_url: str,
        role: Role,
        rank: int | None = None,
        identity: Identity | Issuer,
        ttl: int = DEFAULT_TTL,
        queue_expires: float = 600.0,
        prefetch: int = 256,
        heartbeat: int = 60,
        blocked_connection_timeout: float = 300.0,
        socket_timeout: float = 10.0,
        health_check_interval: int = 30,
        redis_retries: int = 5,
        outage_seconds: float | None = None,
        redis_ca: TrustedCA | None = None,
        amqp_ca: TrustedCA | None = None,
    ) -> None:
        self._identify(job_id, role, rank, identity, ttl)
        window = outage_window(outage_seconds)
        # TLS (rediss://, amqps://): the system's CAs, plus a private CA's bundle if one is named; see .tls.
        # Several URLs are the job's Redis shards (.shards); one is one JobStore, as before sharding.
        stores = [
            JobStore(url, job_id=self.job_id, role=role, rank=self.rank, ttl=self.ttl, outage_seconds=window,
                     ca=redis_ca or ca_from_env("redis"), socket_timeout=socket_timeout,
                     health_check_interval=health_check_interval, redis_retries=redis_retries)
            for url in shard_urls(redis_url) or [redis_url]
        ]
        self._store: JobStore | ShardedStore = stores[0] if len(stores) == 1 else ShardedStore(stores)
        self._instances = len(stores)
        self._bus = JobBus(
            amqp_url, job_id=self.job_id, role=role, rank=self.rank, outage_seconds=window,
            ca=amqp_ca or ca_from_env("amqp"), queue_expires=queue_expires, prefetch=prefetch, heartbeat=heartbeat,
            blocked_connection_timeout=blocked_connection_timeout, socket_timeout=socket_timeout,
        )
        # Connect now (connect() is synchronous), and fail at connect rather than at the first step.
        self._store.connect(CONNECT_SECONDS)
        self._bus.call(lambda: None, window=CONNECT_SECONDS)

    @property
    def store_epoch(self) -> int:  # type: ignore[override]
        return self._store.epoch

    @property
    def store_instances(self) -> int:  # type: ignore[override]
        return self._instances

    @property
    def reconnected_at(self) -> float:  # type: ignore[override]
        # Either service: a supervisor that waited out a Redis outage in any call must not drop the workers that
        # waited it out too (faults/test_outages.py).
        return max(self._bus.reconnected_at, self._store.reconnected_at)

    # ------------------------------------------------------------------ key-value
    def put(self, key: str, value: bytes, ttl: int | None = None) -> None:
        self._store.put(check_key(key), self._seal_value(key, value), int(ttl or self.ttl))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        values = self._store.get_many([check_key(k) for k in keys])
        return [self._unseal_value(k, v) for k, v in zip(keys, values)]

    def run_script(self, source: str, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        return self._store.run_script(source, [check_key(k) for k in keys], args)

    def probe_store(self) -> None:
        self._store.probe()

    def delete_job(self) -> int:
        """Delete the job's keys, then its queues and exchange."""
        deleted, ranks = self._store.delete_job()
        self._bus.delete_queues(ranks)
        return deleted

    def reset(self) -> None:
        self._bus.purge(self._store.reset())

    # ------------------------------------------------------------------ messages
    def send_to_supervisor(self, body: bytes) -> None:
        self._bus.send_to_supervisor(self._seal_message(body))

    def broadcast(self, body: bytes) -> None:
        self._bus.broadcast(self._seal_message(body))

    def receive(self, timeout: float | None) -> bytes | None:
        return self._unseal_message(self._bus.receive(timeout))

    def close(self) -> None:
        if not self._bus.closed:
            self._bus.close()
            self._store.close()

    def __repr__(self) -> str:
        return (
            f"ServicesTransport(job={self.job_id!r}, role={self.role}, rank={self.rank}, "
            f"redis={self._store.desc}, amqp={self._bus.desc})"
        )

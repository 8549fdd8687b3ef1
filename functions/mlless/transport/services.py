"""Transport over real services: Redis (redis-py) for bytes, RabbitMQ (pika) for control frames.

Idioms follow the redis-py and pika documentation:

* **Redis**: one ``ConnectionPool`` per process with an explicit
  ``Retry(ExponentialBackoff)``, socket timeouts and ``health_check_interval``;
  batches go through ``pipeline(transaction=False)`` (plain batching, not
  MULTI/EXEC) or ``MGET``; cleanup is ``SCAN`` by job prefix + ``UNLINK``, never
  ``FLUSHALL`` (the original wiped every job's data).
* **RabbitMQ**: a ``BlockingConnection`` used only from the thread that created
  it, with heartbeats and ``blocked_connection_timeout``.  Publishing happens on
  its own channel with publisher confirms, so ``basic_publish`` returns only once
  the broker has the message and a direct send to a missing queue raises
  (``mandatory``).  Consuming uses a second channel so a channel error while
  publishing (e.g. a deleted exchange) cannot kill the consumer.  Deliveries go
  into a deque via ``basic_consume`` and ``process_data_events(time_limit=…)``,
  which returns as soon as a delivery is ready: this is the low-latency path.
  Each message is acked when ``receive`` hands it out (the original never
  acked).

Outages.  Either service out of reach is waited out for up to
``outage_seconds`` (default 60, or $MLLESS_OUTAGE_SECONDS), with exponential
backoff and jitter; the first connection gets only ``CONNECT_SECONDS``, so a
wrong URL is reported at once.  For Redis that covers a restart (redis-py's
own retries cover a blip); a command Redis refuses is an error at once.  For
RabbitMQ it covers a lost connection, a broker restart and a forced close (320
CONNECTION_FORCED, e.g. ``rabbitmqctl close_all_connections``): the connection
is made again and the topology declared again.  A refused login fails at once,
and so does a TLS certificate the client does not trust (``rediss://`` and
``amqps://``; which CAs it trusts is in ``mlless.transport.tls``).
Queues are not durable, so a broker restart loses what they held; each
transport therefore re-publishes its last ``RESEND_DEPTH`` messages after a
reconnect.  That is safe because every receiver ignores what it has already
seen: a worker a step-close of a step it has applied, the supervisor a report
for a closed step, and a repeated hello, done or left.  A re-sent message
whose queue is not declared again yet (the supervisor reconnects after its
workers) is retried at the next operation.

Topology per job (queues are non-durable and carry ``x-expires`` so a crashed
job's queues vanish by themselves)::

    mlless.{job}.supervisor        the supervisor's queue
    mlless.{job}.worker.{rank}     one per worker, bound to the fanout
    mlless.{job}.workers           fanout exchange (auto-delete)
    mlless.{job}.sink              a zero-length queue bound to the fanout, so
                                   the auto-delete exchange lives while the job
                                   does and disappears when the sink expires

Worker ranks that ever connected are recorded in the Redis set
``mlless:{job}:_ranks`` so ``delete_job`` can delete their queues (AMQP cannot
list queues).
"""
from __future__ import annotations

import collections
import logging
import os
import random
import time
from typing import Any, Callable, Sequence, TypeVar

import pika
import pika.exceptions as pe
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from mlless.contract import ENV_OUTAGE_SECONDS

from .base import (
    DEFAULT_TTL,
    SUPERVISOR,
    Role,
    Transport,
    TransportError,
    UnroutableError,
    check_job_id,
    check_job_key,
    check_key,
    check_role,
    key_prefix,
    redact_url,
)
from .tls import TrustedCA, ca_from_env, redis_tls_options, untrusted_certificate, untrusted_error, uses_tls

__all__ = ["ServicesTransport", "queue_names"]

log = logging.getLogger(__name__)
# pika logs every failed connection attempt at ERROR with a traceback; during an outage that is a screenful per
# second for one fact, which this module reports itself in one line per attempt.
logging.getLogger("pika").setLevel(logging.CRITICAL)
T = TypeVar("T")

_RANKS_KEY = "_ranks"
#: Set by each transport of a job, per process (`_alive:RANK`): when its own is gone, the store lost the job's keys
#: (a Redis restarted without persistence), and `store_epoch` tells the process, which then publishes its frames
#: again. Per process, because the first process to notice sets its mark again, and the others must notice too.
_ALIVE_KEY = "_alive:{rank}"


def queue_names(job_id: str) -> dict[str, str]:
    """AMQP names used by a job (also handy for operators and tests)."""
    return {
        "supervisor": f"mlless.{job_id}.supervisor",
        "worker": f"mlless.{job_id}.worker.{{rank}}",
        "exchange": f"mlless.{job_id}.workers",
        "sink": f"mlless.{job_id}.sink",
    }


def unlink_prefix(client: redis.Redis, prefix: str) -> int:
    """SCAN for `prefix*` and UNLINK in batches; the number of keys deleted."""
    deleted = 0
    batch: list[bytes] = []
    for k in client.scan_iter(match=prefix + "*", count=1000):
        batch.append(k)
        if len(batch) >= 500:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def delete_job_keys(redis_url: str, job_id: str, timeout: float = 10.0, ca: TrustedCA | None = None) -> int:
    """Delete every key of `job_id` from the Redis at `redis_url`, trusting `ca` for TLS (no queue is touched;
    they expire on their own)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  **redis_tls_options(redis_url, ca))
    try:
        return unlink_prefix(client, key_prefix(check_job_id(job_id)))
    except (redis.RedisError, OSError) as exc:
        raise TransportError(f"cannot delete the keys of {job_id} on {redact_url(redis_url)}: {exc}") from None
    finally:
        client.close()


#: How long RabbitMQ may stay unreachable before a transport gives up.
DEFAULT_OUTAGE_SECONDS = 60.0
#: How long the first connection may take: a wrong URL or a service that is not there is reported at once,
#: not after a whole outage window.
CONNECT_SECONDS = 5.0
#: Messages re-published after a reconnect: more than one worker's reports in flight under SSP's default slack.
RESEND_DEPTH = 16
#: Broker closes that no reconnect can fix: access refused (403) and not allowed (530), e.g. a missing vhost.
_REFUSED = (403, 530)


class _Outage:
    """Backoff through one outage: exponential, half of each pause random so that a job's processes do not
    retry in lockstep, until `seconds` have passed since the first failure."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.give_up, self.delay = seconds, time.monotonic() + seconds, 0.05

    def wait(self, service: str, reason: str) -> None:
        """Sleep before the next attempt, or raise TransportError once the outage has lasted too long."""
        left = self.give_up - time.monotonic()
        if left <= 0:
            raise TransportError(f"{service}: unreachable for {self.seconds:g}s: {reason}")
        pause = min(self.delay / 2 + random.uniform(0, self.delay / 2), left)
        log.warning("%s: %s; retrying in %.2fs", service, reason, pause)
        time.sleep(pause)
        self.delay = min(self.delay * 2, 5.0)


class ServicesTransport(Transport):
    """Redis + RabbitMQ backend.  See the module docstring for topology and idioms."""

    def __init__(
        self,
        job_id: str,
        *,
        redis_url: str,
        amqp_url: str,
        role: Role,
        rank: int | None = None,
        key: bytes,
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
        self.job_id = check_job_id(job_id)
        self.role = role
        self.rank = check_role(role, rank)
        self._job_key = check_job_key(key)
        if ttl <= 0:
            raise ValueError("ttl must be > 0 seconds")
        self.ttl = int(ttl)
        self._prefix = key_prefix(job_id)
        self._names = queue_names(job_id)
        self._own_queue = self._queue_of(self.rank)
        self._alive = self._prefix + _ALIVE_KEY.format(rank=self.rank)
        self._deleted = False
        self._queue_args = {"x-expires": max(1000, int(queue_expires * 1000))}
        self._prefetch = prefetch
        if outage_seconds is None:
            outage_seconds = float(os.environ.get(ENV_OUTAGE_SECONDS, DEFAULT_OUTAGE_SECONDS))
        self._outage_seconds = outage_seconds
        self._redis_desc = redact_url(redis_url)
        self._amqp_desc = redact_url(amqp_url)
        # TLS (rediss://, amqps://): the system's CAs, plus a private CA's bundle if one is named; see .tls.
        self._redis_ca = redis_ca or ca_from_env("redis")
        self._amqp_ca = amqp_ca or ca_from_env("amqp")

        # ---- Redis: one pool per process, explicit retries, health checks.
        try:
            self._pool = redis.ConnectionPool.from_url(
                redis_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                socket_keepalive=True,
                health_check_interval=health_check_interval,
                retry=Retry(ExponentialBackoff(cap=2.0, base=0.01), redis_retries),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError],
                **redis_tls_options(redis_url, self._redis_ca),
            )
        except ValueError as exc:
            raise TransportError(f"bad redis url {self._redis_desc}: {exc}") from None
        self.redis = redis.Redis(connection_pool=self._pool)

        # ---- RabbitMQ
        try:
            self._params = pika.URLParameters(amqp_url)
        except Exception as exc:  # pika raises assorted errors on bad URLs
            raise TransportError(f"bad amqp url {self._amqp_desc}: {type(exc).__name__}") from None
        self._params.heartbeat = heartbeat
        self._params.blocked_connection_timeout = blocked_connection_timeout
        self._params.socket_timeout = socket_timeout
        self._params.connection_attempts = 1  # we do our own backoff
        # pika's own amqps:// context verifies against the system's CAs; with a private CA, one that trusts it too.
        if uses_tls("amqp", amqp_url, self._amqp_ca) and self._amqp_ca is not None:
            self._params.ssl_options = pika.SSLOptions(self._amqp_ca.context())
        self._conn: pika.BlockingConnection | None = None
        self._pub: pika.adapters.blocking_connection.BlockingChannel | None = None
        self._sub: pika.adapters.blocking_connection.BlockingChannel | None = None
        self._inbox: collections.deque[tuple[int, bytes]] = collections.deque()
        self._consumer_tag: str | None = None
        self._closed = False
        self._connected_before = False
        # (exchange, routing key, body, mandatory) of the newest publishes, and those to publish again after a
        # reconnect with the time they became due; see the module docstring.
        self._sent: collections.deque[tuple[str, str, bytes, bool]] = collections.deque(maxlen=RESEND_DEPTH)
        self._resend: list[tuple[str, str, bytes, bool]] = []
        self.reconnected_at = -float("inf")

        # Connect now (connect() is synchronous), and fail at connect rather than at the first step.
        self._redis_call(self._mark_store, window=CONNECT_SECONDS)
        self._amqp(lambda: None, window=CONNECT_SECONDS)

    # ------------------------------------------------------------------ helpers
    def _key(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _queue_of(self, rank: int) -> str:
        return self._names["supervisor"] if rank == SUPERVISOR else self._names["worker"].format(rank=rank)

    def _redis_call(self, fn: Callable[[], T], window: float | None = None) -> T:
        """Run ``fn``, waiting out a Redis that cannot be reached for up to ``outage_seconds``; redis-py's own
        retries cover a blip, this a restart."""
        outage = _Outage(self._outage_seconds if window is None else window)
        while True:
            try:
                return fn()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if (untrusted := untrusted_certificate(exc)) is not None:
                    raise untrusted_error("redis", self._redis_desc, untrusted, self._redis_ca) from None
                reason = f"{type(exc).__name__}: {exc}"
            except redis.RedisError as exc:
                raise TransportError(f"redis {self._redis_desc}: {type(exc).__name__}: {exc}") from None
            outage.wait(f"redis {self._redis_desc}", reason)

    def _mark_store(self) -> None:
        """Mark the store as holding this job's keys, and register a worker's rank (the queues delete_job deletes)."""
        with self.redis.pipeline(transaction=False) as p:
            p.set(self._alive, b"1", ex=self.ttl)
            if self.role == "worker":
                p.sadd(self._prefix + _RANKS_KEY, self.rank)
                p.expire(self._prefix + _RANKS_KEY, self.ttl)
            p.execute()

    def _check_store(self, alive: bool) -> None:
        if not alive and not self._deleted:  # after delete_job, the keys are gone on purpose
            self.store_epoch += 1
            log.warning("redis %s lost the keys of job %s (restarted without persistence?)", self._redis_desc, self.job_id)
            self._redis_call(self._mark_store)

    def probe_store(self) -> None:
        self._check_store(bool(self._redis_call(lambda: self.redis.exists(self._alive))))

    # ------------------------------------------------------------------ key-value
    def put(self, key: str, value: bytes, ttl: int | None = None) -> None:
        k, v = self._key(key), self._seal_value(key, value)

        def run() -> list[Any]:
            with self.redis.pipeline(transaction=False) as p:  # one round trip: the write, and the store's mark
                p.set(k, v, ex=int(ttl or self.ttl))
                p.exists(self._alive)
                return p.execute()

        self._check_store(bool(self._redis_call(run)[1]))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        ks = [self._key(k) for k in keys]
        if not ks:
            return []
        *values, alive = self._redis_call(lambda: self.redis.mget(ks + [self._alive]))  # one round trip
        self._check_store(alive is not None)
        return [self._unseal_value(k, v) for k, v in zip(keys, values)]

    def delete_job(self) -> int:
        """SCAN the job prefix and UNLINK in batches; then delete the job's queues and exchange."""

        def run() -> tuple[int, list[int]]:
            rk = self._prefix + _RANKS_KEY
            ranks = sorted(int(r) for r in self.redis.smembers(rk))
            # The transport's own keys are not the caller's.
            self.redis.unlink(rk, *(self._prefix + _ALIVE_KEY.format(rank=r) for r in {*ranks, self.rank, SUPERVISOR}))
            return unlink_prefix(self.redis, self._prefix), ranks

        deleted, ranks = self._redis_call(run)
        self._deleted = True
        queues = [self._names["supervisor"], self._names["sink"]] + [self._queue_of(r) for r in ranks]
        if self.role == "worker" and self._own_queue not in queues:
            queues.append(self._own_queue)

        def drop() -> None:
            ch = self._pub
            assert ch is not None and self._sub is not None
            # Stop consuming first: deleting a queue under a live consumer makes the broker cancel it,
            # and pika logs that cancel as an unknown consumer.
            if self._consumer_tag is not None:
                self._sub.basic_cancel(self._consumer_tag)
                self._consumer_tag = None
            for q in queues:
                ch.queue_delete(q)
            ch.exchange_delete(self._names["exchange"])

        self._amqp(drop)
        self._inbox.clear()
        return deleted

    def reset(self) -> None:
        def run() -> list[int]:
            ranks = sorted(int(r) for r in self.redis.smembers(self._prefix + _RANKS_KEY))
            unlink_prefix(self.redis, self._prefix)
            self._mark_store()
            return ranks

        ranks = self._redis_call(run)

        def purge() -> None:
            ch = self._pub
            assert ch is not None
            for q in [self._own_queue, *(self._queue_of(r) for r in ranks)]:
                # Declared first (the same arguments, so a no-op if it is there): purging an expired queue would
                # close the channel.
                ch.queue_declare(q, durable=False, arguments=self._queue_args)
                ch.queue_purge(q)
            if self._inbox:  # delivered already: acknowledged, or the broker would deliver them again
                assert self._sub is not None
                self._sub.basic_ack(self._inbox[-1][0], multiple=True)

        self._amqp(purge)
        self._inbox.clear()
        self._sent.clear()  # a reconnect must not re-publish the predecessor's messages into the clean slate

    # ------------------------------------------------------------------ AMQP plumbing
    def _connect(self) -> None:
        conn = pika.BlockingConnection(self._params)
        try:
            pub = conn.channel()
            pub.confirm_delivery()
            sub = conn.channel()
            sub.basic_qos(prefetch_count=self._prefetch)
            self._conn, self._pub, self._sub = conn, pub, sub
            self._declare_topology()
            self._inbox.clear()  # unacked deliveries of a dead connection are redelivered by the broker
            self._consumer_tag = sub.basic_consume(self._own_queue, self._on_message, auto_ack=False)
            if self._connected_before:
                log.warning("amqp %s: reconnected; re-publishing the last %d messages", self._amqp_desc, len(self._sent))
                self._resend, self.reconnected_at = list(self._sent), time.monotonic()
            self._connected_before = True
        except BaseException:
            self._conn = self._pub = self._sub = None
            try:
                conn.close()
            except Exception:
                pass
            raise

    def _declare_topology(self) -> None:
        ch = self._pub
        assert ch is not None
        ex = self._names["exchange"]
        ch.exchange_declare(ex, "fanout", durable=False, auto_delete=True)
        if self.role == "supervisor":
            sink = self._names["sink"]
            ch.queue_declare(sink, durable=False, arguments={**self._queue_args, "x-max-length": 0})
            ch.queue_bind(sink, ex)
            ch.queue_declare(self._own_queue, durable=False, arguments=self._queue_args)
        else:
            ch.queue_declare(self._own_queue, durable=False, arguments=self._queue_args)
            ch.queue_bind(self._own_queue, ex)

    def _on_message(self, ch: object, method: pika.spec.Basic.Deliver, props: object, body: bytes) -> None:
        self._inbox.append((method.delivery_tag, body))

    def _amqp(self, op: Callable[[], T], window: float | None = None) -> T:
        """Run ``op`` with a live connection, waiting out an outage of up to ``outage_seconds``."""
        if self._closed:
            raise TransportError("transport is closed")
        outage = _Outage(self._outage_seconds if window is None else window)
        while True:
            try:
                if self._conn is None or not self._conn.is_open:
                    self._connect()
                self._publish_again()
                return op()
            except (pe.ProbableAuthenticationError, pe.ProbableAccessDeniedError, pe.AuthenticationError) as exc:
                self._drop_connection()
                raise TransportError(f"amqp {self._amqp_desc}: login refused: {type(exc).__name__}") from None
            except pe.ConnectionClosedByBroker as exc:
                self._drop_connection()
                if exc.reply_code in _REFUSED:
                    raise TransportError(f"amqp {self._amqp_desc}: refused by the broker: {exc}") from None
                reason = f"closed by the broker ({exc.reply_code} {exc.reply_text})"
            except (pe.AMQPConnectionError, pe.ChannelWrongStateError, OSError) as exc:
                if (untrusted := untrusted_certificate(exc)) is not None:
                    self._drop_connection()
                    raise untrusted_error("amqp", self._amqp_desc, untrusted, self._amqp_ca) from None
                if isinstance(exc, pe.ChannelWrongStateError) and self._conn is not None and self._conn.is_open:
                    raise TransportError(f"amqp {self._amqp_desc}: channel closed: {exc}") from None
                self._drop_connection()
                reason = f"{type(exc).__name__}: {exc}"
            outage.wait(f"amqp {self._amqp_desc}", reason)

    def _recovering(self) -> bool:
        """Within the outage window after a reconnect: a queue may not be declared again yet."""
        return time.monotonic() - self.reconnected_at < self._outage_seconds

    def _publish_again(self) -> None:
        """Re-publish the messages due since a reconnect; one whose queue is not back yet waits for the next call,
        until the outage window has passed."""
        while self._resend:
            exchange, routing_key, body, mandatory = self._resend[0]
            assert self._pub is not None
            try:
                self._pub.basic_publish(exchange, routing_key, body, mandatory=mandatory)
            except pe.UnroutableError:
                if not self._recovering():
                    log.error("amqp %s: queue %r never came back; %d messages not re-sent", self._amqp_desc,
                              routing_key, len(self._resend))
                    self._resend = []
                return
            self._resend.pop(0)

    def _drop_connection(self) -> None:
        conn, self._conn, self._pub, self._sub = self._conn, None, None, None
        self._inbox.clear()
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception:
                pass

    def _publish(self, exchange: str, routing_key: str, body: bytes, *, mandatory: bool) -> None:
        def op() -> None:
            ch = self._pub
            assert ch is not None
            try:
                ch.basic_publish(exchange, routing_key, body, mandatory=mandatory)
                self._sent.append((exchange, routing_key, body, mandatory))
            except pe.UnroutableError:
                if self._recovering():  # its queue comes back when its owner reconnects
                    self._resend.append((exchange, routing_key, body, mandatory))
                    self._sent.append((exchange, routing_key, body, mandatory))
                    return
                raise UnroutableError(f"no queue {routing_key!r} in job {self.job_id}") from None
            except pe.NackError:
                raise TransportError(f"broker nacked a message to {routing_key or exchange!r}") from None
            except pe.ChannelClosedByBroker as exc:
                # e.g. the exchange was deleted: reopen the publishing channel, report the error.
                assert self._conn is not None
                self._pub = self._conn.channel()
                self._pub.confirm_delivery()
                raise TransportError(f"amqp publish to {exchange or routing_key!r} refused: {exc}") from None

        self._amqp(op)

    # ------------------------------------------------------------------ messages
    def send_to_supervisor(self, body: bytes) -> None:
        self._publish("", self._names["supervisor"], self._seal_message(body), mandatory=True)

    def broadcast(self, body: bytes) -> None:
        # Not mandatory: the sink queue makes every publish routable, and zero workers is legal.
        self._publish(self._names["exchange"], "", self._seal_message(body), mandatory=False)

    def receive(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)

        def op() -> bytes | None:
            while True:
                if self._inbox:
                    tag, body = self._inbox.popleft()
                    assert self._sub is not None
                    self._sub.basic_ack(tag)  # receipt is handling
                    return self._unseal_message(body)
                remaining = 1.0 if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    assert self._conn is not None
                    self._conn.process_data_events(time_limit=0)
                    if not self._inbox:
                        return None
                    continue
                assert self._conn is not None
                # Returns as soon as a delivery is dispatched; caps keep heartbeats flowing.
                self._conn.process_data_events(time_limit=min(remaining, 1.0))

        return self._amqp(op)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_connection()
        self._pool.disconnect()

    def __repr__(self) -> str:
        return (
            f"ServicesTransport(job={self.job_id!r}, role={self.role}, rank={self.rank}, "
            f"redis={self._redis_desc}, amqp={self._amqp_desc})"
        )

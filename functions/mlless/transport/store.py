"""``JobStore``: a job's keys in Redis (redis-py), the key-value side of ``ServicesTransport``.

Idioms follow the redis-py documentation: one ``ConnectionPool`` per process
with an explicit ``Retry(ExponentialBackoff)``, socket timeouts and
``health_check_interval``; batches go through ``pipeline(transaction=False)``
(plain batching, not MULTI/EXEC) or ``MGET``; cleanup is ``SCAN`` by job prefix
+ ``UNLINK`` (``mlless.transport.admin.unlink_prefix``), never ``FLUSHALL``
(the original wiped every job's data).

Outages.  A Redis that cannot be reached is waited out
(``mlless.transport.outage``): that covers a restart, and redis-py's own
retries cover a blip.  A command Redis refuses is an error at once, and so is
a TLS certificate the client does not trust (``rediss://``; which CAs it
trusts is in ``mlless.transport.tls``).

Worker ranks that ever connected are recorded in the Redis set
``mlless:{job}:_ranks`` so ``delete_job`` can delete their queues (AMQP cannot
list queues).  The store takes values as they are (sealed by the transport)
under names the transport has checked.
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Any, Callable, Sequence, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .admin import unlink_prefix
from .base import SUPERVISOR, Role, TransportError, key_prefix, redact_url
from .outage import Outage
from .tls import TrustedCA, redis_tls_options, untrusted_certificate, untrusted_error

__all__ = ["JobStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_RANKS_KEY = "_ranks"
#: A worker rank read back from `_ranks` has at most this many digits (ranks only grow with joins, from 0).
MAX_RANK_DIGITS = 9
#: Set by each transport of a job, per process (`_alive:RANK`): when its own is gone, the store lost the job's keys
#: (a Redis restarted without persistence), and `epoch` tells the process, which then publishes its frames
#: again. Per process, because the first process to notice sets its mark again, and the others must notice too.
_ALIVE_KEY = "_alive:{rank}"


def busy(exc: redis.ResponseError) -> bool:
    """Whether Redis refused the command while a script runs past its busy-reply-threshold (the reply starts with
    the error code BUSY; redis-py puts a pipeline's command before it)."""
    return re.search(r"(^|: )BUSY ", str(exc)) is not None


class JobStore:
    """One process's view of a job's keys in one Redis; nothing is sent until the first call."""

    def __init__(
        self,
        redis_url: str,
        *,
        job_id: str,
        role: Role,
        rank: int,
        ttl: int,
        outage_seconds: float,
        ca: TrustedCA | None,
        socket_timeout: float,
        health_check_interval: int,
        redis_retries: int,
    ) -> None:
        self.job_id, self.role, self.rank, self.ttl = job_id, role, rank, ttl
        self.desc = redact_url(redis_url)
        #: How many times the store was found to have lost the job's keys (`Transport.store_epoch`).
        self.epoch = 0
        #: When (monotonic) a call last came through after waiting out an outage (`Transport.reconnected_at`).
        self.reconnected_at = -float("inf")
        self._outage_seconds = outage_seconds
        self._ca = ca
        self._prefix = key_prefix(job_id)
        self._alive = self._prefix + _ALIVE_KEY.format(rank=rank)
        self._deleted = False
        try:
            self._pool = redis.ConnectionPool.from_url(
                redis_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                socket_keepalive=True,
                health_check_interval=health_check_interval,
                retry=Retry(ExponentialBackoff(cap=2.0, base=0.01), redis_retries),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError],
                **redis_tls_options(redis_url, ca),
            )
        except ValueError as exc:
            raise TransportError(f"bad redis url {self.desc}: {exc}") from None
        self.redis = redis.Redis(connection_pool=self._pool)

    def call(self, fn: Callable[[], T], window: float | None = None) -> T:
        """Run ``fn``, waiting out a Redis that cannot be reached for up to ``outage_seconds``; redis-py's own
        retries cover a blip, this a restart. A Redis that answers BUSY (a script, in-store's merge of a large step,
        has run past its busy-reply-threshold) is waited out the same way: it answers again once the script ends."""
        outage = Outage(self._outage_seconds if window is None else window)
        waited = False
        while True:
            try:
                result = fn()
                if waited:
                    self.reconnected_at = time.monotonic()
                return result
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if (untrusted := untrusted_certificate(exc)) is not None:
                    raise untrusted_error("redis", self.desc, untrusted, self._ca) from None
                reason = f"{type(exc).__name__}: {exc}"
            except redis.ResponseError as exc:
                if not busy(exc):
                    raise TransportError(f"redis {self.desc}: {type(exc).__name__}: {exc}") from None
                reason = "busy running a script"
            except redis.RedisError as exc:
                raise TransportError(f"redis {self.desc}: {type(exc).__name__}: {exc}") from None
            outage.wait(f"redis {self.desc}", reason)
            waited = True

    def connect(self, window: float) -> None:
        """Reach the store and mark it, waiting at most `window` seconds: a wrong URL is reported at once."""
        self.call(self.mark, window=window)

    def mark(self) -> None:
        """Mark the store as holding this job's keys, and register a worker's rank (the queues delete_job deletes)."""
        with self.redis.pipeline(transaction=False) as p:
            p.set(self._alive, b"1", ex=self.ttl)
            if self.role == "worker":
                p.sadd(self._prefix + _RANKS_KEY, self.rank)
                p.expire(self._prefix + _RANKS_KEY, self.ttl)
            p.execute()

    def _check(self, alive: bool) -> None:
        if not alive and not self._deleted:  # after delete_job, the keys are gone on purpose
            self.epoch += 1
            log.warning("redis %s lost the keys of job %s (restarted without persistence?)", self.desc, self.job_id)
            self.call(self.mark)

    def probe(self) -> None:
        """Look whether the store has lost the job's keys."""
        self._check(bool(self.call(lambda: self.redis.exists(self._alive))))

    def put(self, key: str, value: bytes, ttl: int) -> None:
        """Store ``value`` under the job's ``key`` for ``ttl`` seconds."""
        k = self._prefix + key

        def run() -> list[Any]:
            with self.redis.pipeline(transaction=False) as p:  # one round trip: the write, and the store's mark
                p.set(k, value, ex=ttl)
                p.exists(self._alive)
                return p.execute()

        self._check(bool(self.call(run)[1]))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values under the job's ``keys``, in one round trip; None for a missing one."""
        ks = [self._prefix + k for k in keys]
        if not ks:
            return []
        *values, alive = self.call(lambda: self.redis.mget(ks + [self._alive]))  # one round trip
        self._check(alive is not None)
        return values

    def run_script(self, source: str, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        """EVALSHA `source` over the job's `keys`, loading it first if Redis does not have it (a new or restarted
        Redis), in one round trip with the store's mark."""
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        ks = [self._prefix + k for k in keys]

        def run() -> list[Any]:
            for _ in range(2):
                with self.redis.pipeline(transaction=False) as p:
                    p.evalsha(sha, len(ks), *ks, *args)
                    p.exists(self._alive)
                    result = p.execute(raise_on_error=False)
                if not isinstance(result[0], redis.exceptions.NoScriptError):
                    break
                self.redis.script_load(source)
            if isinstance(result[0], redis.RedisError):
                raise result[0]
            return result

        reply, alive = self.call(run)
        self._check(bool(alive))
        return reply

    def delete_job(self) -> tuple[int, list[int]]:
        """SCAN the job prefix and UNLINK in batches: the number of the caller's keys deleted, and the worker ranks
        that ever connected (whose queues are the job's)."""

        def run() -> tuple[int, list[int]]:
            rk = self._prefix + _RANKS_KEY
            ranks = self._registered_ranks()
            # The transport's own keys are not the caller's.
            self.redis.unlink(rk, *(self._prefix + _ALIVE_KEY.format(rank=r) for r in {*ranks, self.rank, SUPERVISOR}))
            return unlink_prefix(self.redis, self._prefix), ranks

        deleted, ranks = self.call(run)
        self._deleted = True
        return deleted, ranks

    def _registered_ranks(self) -> list[int]:
        """The worker ranks in `_ranks`, trusting nothing read there: a member that is no rank, or a key of another
        type, is logged in one line and skipped, so that cleanup still deletes every key and the other queues."""
        key = self._prefix + _RANKS_KEY
        try:
            members = self.redis.smembers(key)
        except redis.ResponseError as exc:  # WRONGTYPE: someone wrote another type under the key
            if busy(exc):
                raise
            log.error("%s: not a set of worker ranks (%s); the workers' queues are left to expire", key, exc)
            return []
        ranks, foreign = [], []
        for member in members:
            text = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
            (ranks if text.isdecimal() and len(text) <= MAX_RANK_DIGITS else foreign).append(text)
        if foreign:
            log.error("%s: skipped %d member(s) that are no worker rank, e.g. %r", key, len(foreign), foreign[0][:40])
        return sorted(int(r) for r in ranks)

    def reset(self) -> list[int]:
        """Delete the job's keys but the transport's own, and mark the store again; the worker ranks that ever
        connected. The workers' marks stay: a worker that outlived its supervisor must not take the successor's
        reset for a Redis that lost the job's keys (it would drop the replica the successor asks it for)."""

        def run() -> list[int]:
            ranks = self._registered_ranks()
            unlink_prefix(self.redis, self._prefix,
                          spare=(self._prefix + _ALIVE_KEY.format(rank=""), self._prefix + _RANKS_KEY))
            self.mark()
            return ranks

        return self.call(run)

    def close(self) -> None:
        self._pool.disconnect()

"""Deleting a job's keys from Redis, for whoever cleans up after a job without being one of its processes.

The operator deletes an external Redis's keys of a deleted job with it
(``operator/mlless_operator/handlers/delete.py``); the services transport's
store (``mlless.transport.store``) empties a job with ``unlink_prefix`` too.
This module imports redis only, never pika: deleting a job needs no AMQP client
(``tests/test_admin_imports.py`` checks it).
"""
from __future__ import annotations

import redis

from .base import TransportError, check_job_id, key_prefix, redact_url
from mlless.contract import shard_urls
from .tls import TrustedCA, redis_tls_options

__all__ = ["delete_job_keys", "unlink_prefix"]


def unlink_prefix(client: redis.Redis, prefix: str, spare: tuple[str, ...] = ()) -> int:
    """SCAN for `prefix*` and UNLINK in batches, except the keys that start with one of `spare`; the number of
    keys deleted."""
    deleted = 0
    batch: list[bytes] = []
    kept = tuple(s.encode() for s in spare)
    for k in client.scan_iter(match=prefix + "*", count=1000):
        if kept and k.startswith(kept):
            continue
        batch.append(k)
        if len(batch) >= 500:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def delete_job_keys(redis_url: str, job_id: str, timeout: float = 10.0, ca: TrustedCA | None = None) -> int:
    """Delete every key of `job_id` from the Redis at `redis_url` (from each shard, if it lists several), trusting
    `ca` for TLS (no queue is touched; they expire on their own)."""
    return sum(_delete_keys(url, job_id, timeout, ca) for url in shard_urls(redis_url))


def _delete_keys(redis_url: str, job_id: str, timeout: float, ca: TrustedCA | None) -> int:
    client = redis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  **redis_tls_options(redis_url, ca))
    try:
        return unlink_prefix(client, key_prefix(check_job_id(job_id)))
    except (redis.RedisError, OSError) as exc:
        raise TransportError(f"cannot delete the keys of {job_id} on {redact_url(redis_url)}: {exc}") from None
    finally:
        client.close()

"""What the Byzantine-robust aggregation rules (`spec.sync.aggregation`, sync/aggregation.py) need of a job.

A robust rule combines the updates of one step, so it needs a protocol whose workers add their peers' updates of
each step (BSP, ISP, SSP), or their gradients (gradient averaging): averaging's rounds divide by the carriers of each entry, blocked's rows stay at home and
async and ADMM combine models, not a step's updates. A median of two updates is their mean, so it needs three
workers. An exchange that sums in Redis also needs the job's Redis to be one instance (`one_redis_error`). This
module imports nothing of mlless, so that the schema can read it.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

#: The protocols a robust rule applies under.
PROTOCOLS = ("bsp", "gradient-averaging", "isp", "ssp")
#: The fewest workers a robust rule is admitted with.
MIN_WORKERS = 3
#: `spec.sync.trim`'s default: one update of four is assumed Byzantine.
TRIM = 0.25
#: The rule that is no robust rule.
SUM = "sum"
#: The exchange patterns that run a script in Redis (in-store, sync/exchanges/instore.py): they can only add a step's
#: updates, in one Redis, and the embedded transport has no Redis to run them in.
STORE_EXCHANGES = ("in-store",)


def errors(spec: Mapping[str, Any], default_protocol: str, default_workers: int) -> Iterator[str]:
    """One line per way the parsed manifest's `spec` pairs a robust rule with what it cannot work with."""
    sync = spec.get("sync") if isinstance(spec.get("sync"), Mapping) else {}
    rule = sync.get("aggregation", SUM)
    if rule == SUM:
        return
    protocol = sync.get("protocol", default_protocol)
    if protocol not in PROTOCOLS:
        yield f"spec.sync.aggregation: {rule} needs spec.sync.protocol {' or '.join(PROTOCOLS)}, not {protocol}"
    if sync.get("exchange") in STORE_EXCHANGES:
        yield f"spec.sync.aggregation: {rule} cannot run with spec.sync.exchange {sync['exchange']}, which only sums"
    workers = spec.get("workers", default_workers)
    if isinstance(workers, int) and workers < MIN_WORKERS:
        yield f"spec.sync.aggregation: {rule} needs spec.workers >= {MIN_WORKERS}, not {workers}"


def one_redis_error(exchange: str, shards: int, counted: str) -> str | None:
    """The line refusing `exchange` over `shards` Redis instances, `counted` saying where that number comes from
    (`spec.redis.shards is 2`, `the job's Redis is 2 shards`); None if it can run. In-store's script runs in one
    Redis, and the shards spread a step's updates by rank (transport/shards.py)."""
    if exchange in STORE_EXCHANGES and shards > 1:
        return f"spec.sync.exchange: {exchange} runs a script in one Redis, and {counted}"
    return None

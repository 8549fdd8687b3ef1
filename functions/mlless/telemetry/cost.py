"""Serverless cost of a job at the configured prices (by default the papers' IBM Cloud prices of 2021).

Functions are billed per invocation: its duration rounded up to the billing
granularity, times memory, times the GB-second price. The supervisor is a
function too; Redis and RabbitMQ are always-on instances billed per second
of wall time, as the papers do (MLLess §6.1, "Cost computation": the VMs are
billed hourly, prorated per second to be conservative).

Two accountings of Perf/$ are reported (README, "Cost"): over the whole
bill (`CostBreakdown.total`), and over the worker functions alone
(`CostBreakdown.workers`), the part that follows the size of the pool and so
the part the scale-in auto-tuner acts on. The supervisor and the two
services cost the same per second whatever the pool, so at a small P they
dilute any saving on workers: at P = 4 they are 47 % of the bill's rate at
the papers' prices, at the papers' P = 24 only 13 %.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlless.spec import PricingConfig


def billed_seconds(seconds: float, granularity: float) -> float:
    """Duration rounded up to whole billing units (a 0 s invocation costs nothing)."""
    units = math.ceil(round(seconds / granularity, 9))
    return max(units, 0) * granularity


@dataclass(frozen=True)
class CostBreakdown:
    workers: float
    supervisor: float
    redis: float
    rabbitmq: float

    @property
    def total(self) -> float:
        return self.workers + self.supervisor + self.redis + self.rabbitmq

    def as_dict(self) -> dict[str, float]:
        return {"workers": self.workers, "supervisor": self.supervisor, "redis": self.redis, "rabbitmq": self.rabbitmq}


def perf_per_dollar(seconds: float, dollars: float) -> float | None:
    """The papers' Perf/$ = 1/(seconds × dollars) (MLLess §6.2); None unless both are positive."""
    return 1.0 / (seconds * dollars) if seconds > 0 and dollars > 0 else None


def job_cost(pricing: PricingConfig, invocation_seconds: list[float], wall_seconds: float,
             redis_instances: int = 1) -> CostBreakdown:
    """Cost of worker invocations of the given durations plus a supervisor and services running `wall_seconds`
    (`redis_instances` Redis VMs: a sharded Redis, mlless.transport.shards)."""
    gb_price = pricing.function_memory_gb * pricing.price_per_gb_second
    granularity = pricing.billing_granularity_seconds
    workers = sum(billed_seconds(s, granularity) for s in invocation_seconds) * gb_price
    return CostBreakdown(
        workers=workers,
        supervisor=billed_seconds(wall_seconds, granularity) * gb_price,
        redis=redis_instances * wall_seconds * pricing.redis_per_hour / 3600.0,
        rabbitmq=wall_seconds * pricing.rabbitmq_per_hour / 3600.0,
    )

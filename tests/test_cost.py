"""Serverless cost arithmetic at the papers' prices."""
import pytest

from mlless.telemetry.cost import billed_seconds, job_cost, perf_per_dollar
from mlless.spec import PricingConfig


def test_billing_rounds_up_to_granularity():
    assert billed_seconds(0.0, 0.1) == 0
    assert billed_seconds(0.1, 0.1) == pytest.approx(0.1)
    assert billed_seconds(0.1001, 0.1) == pytest.approx(0.2)
    assert billed_seconds(12.34, 0.1) == pytest.approx(12.4)


def test_job_cost_matches_the_papers_formula():
    pricing = PricingConfig()
    cost = job_cost(pricing, [10.05, 20.0], wall_seconds=36.0)
    gb_price = 2 * 1.7e-5
    assert cost.workers == pytest.approx((10.1 + 20.0) * gb_price)
    assert cost.supervisor == pytest.approx(36.0 * gb_price)
    assert cost.redis == pytest.approx(0.17 * 36 / 3600)
    assert cost.rabbitmq == pytest.approx(0.15 * 36 / 3600)
    assert cost.total == pytest.approx(sum(cost.as_dict().values()))
    sharded = job_cost(pricing, [10.05, 20.0], wall_seconds=36.0, redis_instances=2)  # a Redis VM per shard
    assert sharded.redis == pytest.approx(2 * cost.redis) and sharded.rabbitmq == cost.rabbitmq


def test_perf_per_dollar_is_the_papers_metric_and_undefined_without_time_or_cost():
    assert perf_per_dollar(20.0, 0.005) == pytest.approx(10.0)
    assert perf_per_dollar(0.0, 0.005) is None
    assert perf_per_dollar(20.0, 0.0) is None


def test_fixed_components_dilute_a_saving_on_workers_and_the_workers_accounting_shows_it_whole():
    """Halving the worker-seconds at the same wall time halves the workers' bill, but not the whole bill:
    the supervisor and the two services cost the same per second whatever the pool (README, "Cost")."""
    pricing = PricingConfig()
    wall = 100.0
    full = job_cost(pricing, [wall] * 4, wall_seconds=wall)  # 4 workers for the whole job
    half = job_cost(pricing, [wall] * 2, wall_seconds=wall)  # the same job at 2 workers
    assert perf_per_dollar(wall, half.workers) / perf_per_dollar(wall, full.workers) == pytest.approx(2.0)
    gain = perf_per_dollar(wall, half.total) / perf_per_dollar(wall, full.total)
    fixed = full.supervisor + full.redis + full.rabbitmq
    assert gain == pytest.approx((full.workers + fixed) / (full.workers / 2 + fixed))
    assert 1.0 < gain < 1.5  # at P = 4 the fixed part is ~47 % of the rate at the papers' prices
    assert fixed / full.total == pytest.approx(0.475, abs=0.005)

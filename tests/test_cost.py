"""Serverless cost arithmetic at the papers' prices."""
import pytest

from mlless.telemetry.cost import billed_seconds, job_cost
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

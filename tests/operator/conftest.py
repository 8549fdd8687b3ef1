"""The fixtures of the operator tests: a kubeconfig for the operator, and a fresh emulated cluster per test."""
from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import kmock
import pytest
import pytest_asyncio
import redis

from kmock_emulator import Emulator  # tests/operator/ is on sys.path (rootdir-relative test modules)
from scenario import FN_NS, Cluster, declare, training_job, unique


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], None]:
    def point_at(url: str) -> None:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: kmock, cluster: {{server: '{url}'}}}}]\n"
            "users: [{name: kmock, user: {}}]\n"
            "contexts: [{name: kmock, context: {cluster: kmock, user: kmock, namespace: team}}]\n"
            "current-context: kmock\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("MLLESS_OPERATOR_METRICS_PORT", "0")
        monkeypatch.setenv("MLLESS_OPERATOR_STATUS_INTERVAL", "0.2")
        monkeypatch.setenv("MLLESS_OPERATOR_OPENFAAS_NAMESPACE", FN_NS)
        monkeypatch.setenv("MLLESS_OPERATOR_IMAGE", "registry.example/mlless:test")

    return point_at


@pytest_asyncio.fixture
async def cluster_factory(operator_env: Callable[[str], None]) -> AsyncIterator[Callable[..., Any]]:
    @asynccontextmanager
    async def make(knative: bool = False, openfaas: bool = False) -> AsyncIterator[Cluster]:
        emu = Emulator()
        declare(emu, knative=knative, openfaas=openfaas)
        async with emu, kmock.Server(emu) as server:
            operator_env(str(server.url))
            yield Cluster(emu, str(server.url))

    yield make


@pytest.fixture
def e2e_job(movielens_dir: Path, redis_url: str, amqp_url: str) -> Callable[..., dict[str, Any]]:
    """`e2e_job(prefix, **spec)`: an end-to-end job's manifest, named uniquely after `prefix`, on the MovieLens sample
    and the real Redis and RabbitMQ (named as external services)."""
    return lambda prefix, **spec: training_job(unique(prefix), movielens_dir, redis_url, amqp_url, **spec)


@pytest.fixture
def store(redis_url: str) -> redis.Redis:
    """A client of the real Redis the end-to-end jobs use."""
    return redis.Redis.from_url(redis_url)

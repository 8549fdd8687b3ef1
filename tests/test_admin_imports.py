"""Deleting a job's keys loads no AMQP client: the operator's delete handler imports `mlless.transport.admin`."""
from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = "import sys, {module}; print(sorted(m for m in sys.modules if m == 'pika' or m.startswith('pika.')))"


@pytest.mark.parametrize("module, loads_pika", [("mlless.transport.admin", False), ("mlless.transport.bus", True)])
def test_admin_imports_redis_but_not_pika(module: str, loads_pika: bool) -> None:
    """The second case shows the probe can see pika; the first, that admin does not load it."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, check=True)
    assert (out.stdout.strip() != "[]") is loads_pika, out.stdout


def test_the_operators_delete_handler_loads_no_pika() -> None:
    probe = "import sys, mlless_operator.handlers.delete; assert 'pika' not in sys.modules, 'pika was imported'"
    subprocess.run([sys.executable, "-c", probe], check=True)

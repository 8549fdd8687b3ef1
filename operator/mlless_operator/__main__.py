"""`mlless-operator` and `python -m mlless_operator`: run the operator standalone (one replica, no peering) with a
liveness endpoint."""
from __future__ import annotations

import sys

from kopf.cli import main as kopf_main

from mlless.contract import OPERATOR_HEALTH_PORT
from mlless_operator import config as config_module


def argv() -> list[str]:
    cfg = config_module.load()
    scope = [f"--namespace={ns}" for ns in cfg.namespaces] or ["--all-namespaces"]
    return ["run", "--standalone", f"--liveness=http://0.0.0.0:{OPERATOR_HEALTH_PORT}/healthz", *scope, "-m", "mlless_operator.main"]


def main() -> None:
    sys.argv = ["kopf", *argv()]
    kopf_main()


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""What HTTP function invocation costs: local worker processes vs `mlless worker-server` invocations.

The same PMF job (MovieLens sample, P workers, ISP, a fixed number of steps)
runs three ways over Redis + RabbitMQ on this machine:

  * `processes`: `mlless train`'s launcher, one `mlless worker` process per rank;
  * `http`: the Knative/OpenFaaS path: the supervisor POSTs one invocation per
    rank to a `mlless worker-server` (here one server with room for P
    invocations), with a function timeout long enough that no invocation
    returns before the end;
  * `http, timeout T`: the same with a short function timeout, so every
    invocation checkpoints to Redis before its deadline and is invoked again.

Reported: wall time, invocations, and the cost of one checkpoint + re-invocation,
(wall(timeout T) - wall(http)) / re-invocations. Startup (process start,
imports, dataset open) is part of every wall time.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from mlless.contract import ENV_IDENTITY  # noqa: E402
from mlless.protocol.identity import ANY_WORKER, SUPERVISOR, Issuer  # noqa: E402
from mlless.launch.launcher import HttpLauncher, Launcher, LocalLauncher  # noqa: E402
from mlless.runtime.local import new_job_id  # noqa: E402
from mlless.runtime.supervisor.loop import Supervisor  # noqa: E402
from mlless.spec import load_manifest  # noqa: E402
from mlless.transport import connect  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(job_id: str, issuer: Issuer, concurrency: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "REDIS_URL": _common.REDIS, "AMQP_URL": _common.AMQP, "MLLESS_JOB_ID": job_id,
           ENV_IDENTITY: issuer.issue(ANY_WORKER).text()}  # a function's replicas serve any rank
    cmd = [sys.executable, "-m", "mlless", "worker-server", "--port", str(port), "--concurrency", str(concurrency)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "healthz", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the worker server did not come up; see {log}")


def run(job_file: Path, base: Path, mode: str, timeout: float | None) -> dict:
    job = load_manifest(job_file)
    job_id, issuer = new_job_id("bench-invoke"), Issuer()
    run_dir = base / f"run-{mode}-{timeout}-{int(time.time() * 1000) % 10**8}"
    run_dir.mkdir(parents=True)
    server = None
    launcher: Launcher
    if mode == "processes":
        (run_dir / "job.json").write_text(job.to_json())
        env = {"MLLESS_JOB_ID": job_id, "REDIS_URL": _common.REDIS, "AMQP_URL": _common.AMQP}
        launcher = LocalLauncher(run_dir / "job.json", env, run_dir / "logs", issuer)
    else:
        server, url = start_server(job_id, issuer, job.workers, run_dir / "server.log")
        launcher = HttpLauncher(url, job, job_id, timeout_seconds=timeout or 3600)
    transport = connect(job_id, role="supervisor", redis_url=_common.REDIS, amqp_url=_common.AMQP,
                        identity=issuer.issue(SUPERVISOR))
    try:
        started = time.perf_counter()
        summary = Supervisor(job, job_id, transport, launcher, run_dir).run()
        wall = time.perf_counter() - started
    finally:
        transport.close()
        if server is not None:
            server.terminate()
            server.wait()
    invocations = sum(launcher.invocations.values()) if isinstance(launcher, HttpLauncher) else job.workers
    return {"mode": mode, "timeout": timeout, "wall": wall, "steps": summary["steps"], "invocations": invocations,
            "rmse": summary["validation_loss"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--timeouts", type=float, nargs="+", default=[30.0, 15.0], help="short function timeouts (s)")
    ap.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                    help="where the prepared dataset and the runs go (default %(default)s)")
    ap.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    args = ap.parse_args(argv)

    info = _common.machine_info()
    print(_common.machine_line(info))
    data = _common.prepare(args.data_dir / "movielens", "--sample", "movielens-small")
    base = args.data_dir / "invocation"
    base.mkdir(parents=True, exist_ok=True)
    job = _common.write_pmf_job(base / "job.yaml", name="bench-invoke", workers=args.workers, data=data,
                                protocol="isp", stop={"maxSteps": args.steps})
    results = [run(job, base, "processes", None), run(job, base, "http", None)]
    results += [run(job, base, "http", t) for t in args.timeouts]
    baseline = results[1]
    rows = []
    for r in results:
        reinvocations = r["invocations"] - args.workers
        per = (r["wall"] - baseline["wall"]) / reinvocations if r["mode"] == "http" and reinvocations > 0 else None
        label = r["mode"] if r["timeout"] is None else f"http, timeout {r['timeout']:g} s"
        rows.append([label, r["steps"], _common.fmt(r["wall"], 1), r["invocations"], _common.fmt(per, 2), _common.fmt(r["rmse"])])
        print(rows[-1], flush=True)
    header = ["launcher", "steps", "wall s", "invocations", "s per checkpoint + re-invocation", "val RMSE"]
    body = [
        "## Worker invocation overhead (`benchmarks/invocation_overhead.py`)",
        "",
        f"PMF on the MovieLens sample, {args.workers} workers, ISP, {args.steps} steps, Redis + RabbitMQ on loopback.",
        f"Run: {_common.machine_line(info)}.",
        f"Command: `{_common.command_line()}`",
        "",
        _common.table(header, rows),
    ]
    if args.write_results:
        _common.update_results("invocation_overhead", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())

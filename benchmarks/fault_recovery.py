"""Recovery time per service fault: how long a fault stalls a job, and what the job ends with.

Each case runs the same PMF job (MovieLens sample, 2 workers, BSP, `--steps` steps) with `mlless train` over a
RabbitMQ node and a Redis of this script's own (started with the fault tests' helpers, `tests/faults/conftest.py`,
on free ports; the shared services are not touched), and injects one fault after `--fault-at` recorded steps:

- **rabbitmq forced close**: `rabbitmqctl close_all_connections` (every client gets 320 CONNECTION_FORCED);
- **rabbitmq restart**: `stop_app`, 3 s, `start_app` (its queues and what they held are lost);
- **redis restart, no persistence**: `shutdown nosave`, 2 s, a new empty Redis on the same port;
- **worker kill -9**: one worker process killed (it is dropped; the job goes on with the other).

Reported per case, from the run's summary.json and metrics.jsonl:
- **stall s**: the longest time between two consecutive step closes, minus the median one (what the fault cost);
- **down s**: how long the service was away on purpose (the stall beyond it is the recovery itself);
- the job's steps, workers dropped and at the end (a dropped worker's rank is replaced by a new one),
  `rejected_frames`, `repaired_frames`, and the replica spread (BSP: ~0).

A supervisor killed with -9 and resumed is measured by benchmarks/failover.py.

    python benchmarks/fault_recovery.py --write-results
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import DEFAULT_DATA_DIR, command_line, machine_line, prepare, table, update_results, write_pmf_job  # noqa: E402
from faults.conftest import rabbit_node, redis_server  # noqa: E402


def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(job: Path, run: Path, redis_url: str, amqp_url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlless", "train", str(job), "--out", str(run), "-q",
                             "--redis-url", redis_url, "--amqp-url", amqp_url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stall(run: Path) -> float:
    times = [r["time"] for r in rows(run)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return max(gaps) - statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--fault-at", type=int, default=100)
    parser.add_argument("--write-results", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    data = prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    work = args.data_dir / "fault-recovery"
    work.mkdir(parents=True, exist_ok=True)
    job = write_pmf_job(work / "job.yaml", name="faults", workers=2, data=data, protocol="bsp",
                        stop={"maxSteps": args.steps}, evaluate_every=10)
    lines = []
    with rabbit_node() as rabbit:
        for case in ("rabbitmq forced close", "rabbitmq restart", "redis restart, no persistence", "worker kill -9"):
            with redis_server() as port:
                redis_url = f"redis://127.0.0.1:{port}/0"
                run = work / case.replace(" ", "-").replace(",", "")
                subprocess.run(["rm", "-rf", str(run)], check=True)
                proc = train(job, run, redis_url, rabbit.url)
                while len(rows(run)) < args.fault_at:
                    if proc.poll() is not None:
                        raise SystemExit(f"{case}: the job ended before the fault:\n{proc.communicate()[1][-2000:]}")
                    time.sleep(0.02)
                down = 0.0
                if case == "rabbitmq forced close":
                    rabbit.ctl("close_all_connections", "benchmark")
                elif case == "rabbitmq restart":
                    rabbit.ctl("stop_app")
                    time.sleep(down := 3.0)
                    rabbit.ctl("start_app")
                elif case == "worker kill -9":
                    worker = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                            text=True).stdout.split()[0]
                    os.kill(int(worker), signal.SIGKILL)
                if case != "redis restart, no persistence":
                    _, err = proc.communicate()
                else:
                    subprocess.run(["redis-cli", "-u", redis_url, "shutdown", "nosave"], capture_output=True)
                    time.sleep(down := 2.0)
                    with redis_server(port=urlsplit(redis_url).port):
                        _, err = proc.communicate()
                if proc.returncode != 0:
                    raise SystemExit(f"{case}: mlless train failed:\n{err[-2000:]}")
                s = json.loads((run / "summary.json").read_text())
                lines.append([case, f"{down:g}", f"{stall(run):.2f}", s["steps"], len(s["dropped_workers"]),
                              s["workers_final"], s["rejected_frames"],
                              s["repaired_frames"], f"{s['replica_spread']:.1e}", s["stop_reason"]])
                print(lines[-1], flush=True)
    body = "\n".join([
        machine_line(), "", f"`{command_line()}`", "",
        table(["fault", "down s", "stall s", "steps", "dropped", "workers at the end", "rejected frames", "repaired frames",
               "replica spread", "stop reason"], lines),
    ])
    print(body)
    if args.write_results:
        update_results("fault_recovery", "### Recovery time per fault (benchmarks/fault_recovery.py)\n\n" + body)


if __name__ == "__main__":
    main()

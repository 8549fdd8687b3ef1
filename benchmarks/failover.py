"""Supervisor failover: what a kill -9 of the supervisor costs a job, resumed with `mlless train --resume`.

For each transport (the local Redis + RabbitMQ, the embedded broker) and each kill point, the same PMF job
(MovieLens sample, 2 workers, BSP, `--steps` steps) runs once uninterrupted and once killed with -9 after
`kill-at` recorded steps, then resumed at once. Reported per case, from the runs' summary.json and metrics.jsonl:

- **from**: what the resumed run went on from (the surviving workers' replicas, or the newest checkpoint);
- **steps redone**: steps recorded before the kill that the resumed run trained again (from a checkpoint older
  than the kill);
- **takeover s**: the resumed supervisor's start to its first step (asking survivors for their replicas,
  clearing the old run's keys and queues, starting the workers), as `summary.json` `takeovers[].seconds`;
- **Δ validation RMSE**: resumed minus uninterrupted, at the same step count;
- **wall s / cost**: whole job, the killed run's time and cost included.

    python benchmarks/failover.py --write-results
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import AMQP, DEFAULT_DATA_DIR, REDIS, command_line, machine_line, prepare, table, update_results, write_pmf_job  # noqa: E402


def train(job: Path, run: Path, services: bool, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlless", "train", str(job), "--out", str(run), "-q", *extra]
    if services:
        cmd += ["--redis-url", REDIS, "--amqp-url", AMQP]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"mlless train failed:\n{err[-2000:]}")


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def case(job: Path, work: Path, services: bool, kill_at: int) -> dict:
    run = work / f"killed-{'services' if services else 'embedded'}-{kill_at}"
    shutil.rmtree(run, ignore_errors=True)  # the kill is timed by the rows of this run's metrics.jsonl
    proc = train(job, run, services)
    while rows(run) < kill_at:
        if proc.poll() is not None:
            raise SystemExit(f"the job ended before step {kill_at}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    recorded = rows(run)
    finish(train(job, run, services, "--resume"))
    s = summary(run)
    [takeover] = s["takeovers"]
    return {"run": s, "recorded": recorded, "takeover": takeover}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kill-at", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--write-results", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    data = prepare(args.data_dir / "movielens-small", "--sample", "movielens-small")
    work = args.data_dir / "failover"
    work.mkdir(parents=True, exist_ok=True)
    job = write_pmf_job(work / "job.yaml", name="failover", workers=2, data=data, protocol="bsp",
                        stop={"maxSteps": args.steps}, evaluate_every=10)
    lines = []
    for services in (True, False):
        reference = work / f"reference-{'services' if services else 'embedded'}"
        finish(train(job, reference, services))
        ref = summary(reference)
        for kill_at in args.kill_at:
            c = case(job, work, services, kill_at)
            s, t = c["run"], c["takeover"]
            lines.append([
                "Redis + RabbitMQ" if services else "embedded", kill_at, t["from"], max(0, c["recorded"] - t["step"]),
                f"{t['seconds']:.2f}", s["steps"], f"{s['validation_loss'] - ref['validation_loss']:+.4f}",
                f"{s['wall_seconds']:.1f} / {ref['wall_seconds']:.1f}", f"{s['cost_usd']:.5f} / {ref['cost_usd']:.5f}",
            ])
            print(lines[-1], flush=True)
    body = "\n".join([
        machine_line(),
        "",
        f"`{command_line()}`",
        "",
        table(["transport", "killed at step", "resumed from", "steps redone", "takeover s", "steps",
               "Δ validation RMSE", "wall s (killed+resumed / uninterrupted)", "cost $ (same)"], lines),
    ])
    print(body)
    if args.write_results:
        update_results("failover", "### Supervisor failover (benchmarks/failover.py)\n\n" + body)


if __name__ == "__main__":
    main()

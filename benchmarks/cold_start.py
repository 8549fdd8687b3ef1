"""Image size and cold start of built mlless images (buildah, vfs storage, chroot isolation).

For each image given (e.g. the single image of an older commit, and the `worker`, `operator` and `full`
targets of the Dockerfile):

- **size**: `du` of the container's root filesystem and of its virtualenv `/opt/mlless`, and which of the
  operator's and the reports' packages (kopf, kubernetes, matplotlib) the virtualenv holds;
- **create**: seconds for `buildah from`, which copies every layer into a fresh root with vfs storage — a proxy
  for a node unpacking a pulled image (the pull itself is not measured: there is no registry here);
- **container start**: `buildah run ... -- true`, the runtime's own cost (the same for every image);
- **import**: seconds to `import mlless.cli` inside the container, timed by the interpreter itself;
- **server ready**: from starting the container to `mlless worker-server` answering `/healthz` (what
  Knative or OpenFaaS wait for before the first invocation);
- **first step**: from starting the container to the first row of `metrics.jsonl` of `mlless train` on a tiny
  synthetic PMF job with one worker process over the embedded transport: the interpreter, the imports of the
  supervisor and of the worker process it spawns, the dataset, and one step.

Every timed run but `create` repeats `--repeats` times, the images interleaved; the median and the range
are reported.
The page cache is warm after the first run (nothing drops it: other work shares the machine), so the figures
are for files already in memory, as on a node that has just unpacked the image.

    python benchmarks/cold_start.py mlless:before mlless:worker mlless:operator mlless:full --write-results
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import AMQP, DEFAULT_DATA_DIR, REDIS, command_line, cpu_model, loadavg, ram_gb, table, update_results  # noqa: E402

ROLE_PACKAGES = ("kopf", "kubernetes", "matplotlib")
SITE = "opt/mlless/lib/python3.11/site-packages"
IMPORT_SCRIPT = "import time; t = time.perf_counter(); import mlless.cli; print(time.perf_counter() - t)"
JOB = """\
apiVersion: mlless.io/v1alpha1
kind: TrainingJob
metadata:
  name: cold-start
spec:
  workers: 1
  model:
    type: pmf
  dataset:
    uri: data
  stop:
    maxSteps: {steps}
"""


class Buildah:
    def __init__(self, command: str) -> None:
        self.command = shlex.split(command)

    def __call__(self, *args: str) -> str:
        return subprocess.run([*self.command, *args], check=True, capture_output=True, text=True).stdout.strip()

    def run_argv(self, container: str, *argv: str, volume: Path | None = None) -> list[str]:
        mount = ["-v", f"{volume}:/cs"] if volume else []
        # Host networking, so the host can reach the worker server's port.
        return [*self.command, "run", "--isolation", "chroot", "--network", "host", *mount, container, "--", *argv]


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])


def timed(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - started, out


def until(check, proc: subprocess.Popen, started: float, limit: float) -> float:
    """Seconds from `started` until `check()` holds, polling every 5 ms; fails if `proc` exits first."""
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before it was ready")
        if time.perf_counter() - started > limit:
            raise RuntimeError(f"{proc.args} not ready after {limit}s")
        time.sleep(0.005)
    return time.perf_counter() - started


def first_step(buildah: Buildah, container: str, work: Path, run: str) -> float:
    metrics = work / run / "metrics.jsonl"
    shutil.rmtree(work / run, ignore_errors=True)  # a run of an earlier invocation would count as ready at once
    started = time.perf_counter()
    proc = subprocess.Popen(buildah.run_argv(container, "mlless", "train", "/cs/job.yaml", "--out", f"/cs/{run}", "-q",
                                             volume=work), stdout=subprocess.DEVNULL)
    seconds = until(lambda: metrics.exists() and metrics.stat().st_size > 0, proc, started, 120)
    if proc.wait(timeout=120) != 0:
        raise RuntimeError(f"mlless train in {container} failed")
    return seconds


def server_ready(buildah: Buildah, container: str, port: int, linger: float) -> float:
    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as response:
                return response.status == 200
        except OSError:
            return False

    if answers():
        raise RuntimeError(f"something already answers on port {port}: pick another with --port")
    started = time.perf_counter()
    # `timeout` ends the server from inside the container: it exits on SIGTERM, as in a pod. The server wants the
    # service URLs at start but connects only when invoked, and it is never invoked here.
    proc = subprocess.Popen(buildah.run_argv(container, "timeout", "-s", "TERM", str(linger), "env", f"REDIS_URL={REDIS}",
                                             f"AMQP_URL={AMQP}", "mlless", "worker-server", "--host", "127.0.0.1",
                                             "--port", str(port)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = until(answers, proc, started, linger)
    proc.wait(timeout=linger + 30)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="built images, e.g. mlless:worker")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per image (default 5)")
    parser.add_argument("--quick", action="store_true", help="one timed run per image")
    parser.add_argument("--steps", type=int, default=20, help="steps of the tiny job (default 20)")
    parser.add_argument("--rows", type=int, default=20000, help="ratings of its synthetic dataset (default 20000)")
    parser.add_argument("--port", type=int, default=18080, help="port of the worker server (default 18080)")
    parser.add_argument("--buildah", default="buildah --storage-driver vfs", help="buildah command (default: %(default)s)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="work directory parent (default %(default)s)")
    parser.add_argument("--write-results", action="store_true", help="refresh the cold_start section of RESULTS.md")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    buildah = Buildah(args.buildah)
    work = args.data_dir / "cold-start"
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o777)  # the images run as uid 10001
    (work / "job.yaml").write_text(JOB.format(steps=args.steps))
    load = loadavg()

    containers: dict[str, str] = {}
    facts: dict[str, dict] = {}
    try:
        for image in args.images:
            started = time.perf_counter()
            containers[image] = buildah("from", "--pull-never", image)
            created = time.perf_counter() - started
            root = Path(buildah("mount", containers[image]))
            facts[image] = {
                "rootfs": du(root),
                "venv": du(root / "opt/mlless"),
                "packages": [p for p in ROLE_PACKAGES if (root / SITE / p).is_dir()],
                "create": created,
            }
            buildah("umount", containers[image])
            print(f"{image}: {json.dumps(facts[image])}", flush=True)
        if not (work / "data" / "manifest.json").exists():
            subprocess.run(buildah.run_argv(containers[args.images[0]], "mlless", "prepare", "--synthetic", "pmf",
                                            "--rows", str(args.rows), "--out", "/cs/data", "--quiet", volume=work),
                           check=True, stdout=subprocess.DEVNULL)

        samples: dict[str, dict[str, list[float]]] = {i: {} for i in args.images}
        for r in range(repeats):
            for n, image in enumerate(args.images):
                c, s = containers[image], samples[image]
                s.setdefault("start", []).append(timed(buildah.run_argv(c, "true"))[0])
                s.setdefault("import", []).append(float(timed(buildah.run_argv(c, "python", "-c", IMPORT_SCRIPT))[1]))
                s.setdefault("ready", []).append(server_ready(buildah, c, args.port, linger=10))
                s.setdefault("first", []).append(first_step(buildah, c, work, f"run-{n}-{r}"))
                print(f"{image} run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in s.items()), flush=True)
    finally:
        for c in containers.values():
            subprocess.run([*buildah.command, "rm", c], capture_output=True)

    def med(image: str, key: str) -> str:
        """Median, with the range in parentheses: the machine is shared, and one slow run says nothing by itself."""
        values = samples[image][key]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    rows = [[f"`{image}`", f"{facts[image]['rootfs'] / 1e6:.0f}", f"{facts[image]['venv'] / 1e6:.0f}",
             ", ".join(facts[image]["packages"]) or "none", f"{facts[image]['create']:.1f}", med(image, "start"),
             med(image, "import"), med(image, "ready"), med(image, "first")] for image in args.images]
    body = table(["image", "rootfs MB", "/opt/mlless MB", "kopf / kubernetes / matplotlib", "create s",
                  "container start s", "import mlless.cli s", "server ready s", "first step s"], rows)
    print(body)
    if args.write_results:
        rev = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        header = (
            "## Packaging and cold start (`benchmarks/cold_start.py`)\n\n"
            f"Run: {time.strftime('%Y-%m-%d %H:%M %Z')}; {cpu_model()}, {os.cpu_count()} cores, {ram_gb():.1f} GB RAM; "
            f"load average at start {load}; {buildah('--version')}, vfs storage, chroot isolation; git {rev}.\n"
            f"Command: `{command_line()}`; medians (and ranges) of {repeats} runs; tiny job: synthetic PMF, {args.rows} ratings, "
            f"1 worker, {args.steps} steps, embedded transport.\n\n"
        )
        update_results("cold_start", header + body)


if __name__ == "__main__":
    main()

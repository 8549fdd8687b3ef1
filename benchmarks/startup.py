"""What starting costs a job: an image's cold start, forked workers, HTTP invocations, and a warm start.

Parts (`--parts`, default all):

* images: for each built image given (`--images mlless:worker mlless:operator ...`; skipped without them or without
  buildah), its root filesystem's and virtualenv's size and which of kopf, kubernetes, matplotlib it holds; `create`
  (`buildah from`, vfs: every layer copied, a proxy for a node unpacking a pull); `container start` (`buildah run --
  true`); `import mlless.cli` inside; `server ready` (the start of `mlless worker-server` to its /healthz answering,
  what Knative or OpenFaaS wait for); `first step` (the start of `mlless train` of a tiny PMF job to its first row).
  Medians (and ranges) of `--repeats` runs, the images interleaved; the page cache is warm after the first.
* forked: a short PMF job (MovieLens sample, P = 2, 1 epoch, embedded) with its workers forked from a warm zygote
  (launch/zygote.py, the default) and as new interpreters (`MLLESS_ZYGOTE=0`), alternating: start-up, wall
  seconds, the workers' billed seconds and the cost.
* http: the same PMF job (P = 3, ISP, Redis + RabbitMQ) with `mlless train`'s local worker processes, with HTTP
  invocations of one `mlless worker-server` (the Knative/OpenFaaS path), and with function timeouts short enough
  that every invocation checkpoints and is invoked again: wall time, invocations, seconds per checkpoint +
  re-invocation.
* warm: retraining on new ratings from the earlier model (`spec.model.initFrom`) against a cold start: the old model
  trains on a random 80 % of the MovieLens sample's ratings; then a cold and a warm job train on all of them, and
  the table gives when each first reached the cold run's best validation RMSE + `--slack`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from . import _common, _runs

ROLE_PACKAGES = ("kopf", "kubernetes", "matplotlib")
SITE = "opt/mlless/lib/python3.11/site-packages"
IMPORT_SCRIPT = "import time; t = time.perf_counter(); import mlless.cli; print(time.perf_counter() - t)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="images,forked,http,warm", help="comma list (default %(default)s)")
    p.add_argument("--images", nargs="*", default=[], metavar="IMAGE", help="built images, e.g. mlless:worker")
    p.add_argument("--buildah", default="buildah --storage-driver vfs", help="buildah command (default: %(default)s)")
    p.add_argument("--port", type=int, default=18080, help="the images' worker server's port (default %(default)s)")
    p.add_argument("--repeats", type=int, help="timed runs per image / job pair (default 5, 3 and 2; --quick 1)")
    p.add_argument("--steps", type=int, help="the HTTP part's steps (default 3000; --quick 600)")
    p.add_argument("--timeouts", type=float, nargs="+", help="the HTTP part's short timeouts (default 30 15; --quick 20)")
    p.add_argument("--slack", type=float, default=0.005, help="the warm start's target over the cold best (default 0.005)")


def run(args: argparse.Namespace) -> str:
    parts, out = args.parts.split(","), []
    work = args.data_dir / "startup"
    work.mkdir(parents=True, exist_ok=True)
    if "images" in parts:
        out.append(images(args, work))
    if "forked" in parts:
        out.append(forked(args, work))
    if "http" in parts:
        out.append(http(args, work))
    if "warm" in parts:
        out.append(warm(args, work))
    return "\n".join(out)


def spread(values: list[float]) -> str:
    """The median, with the range: the machine is shared, and one slow run says nothing by itself."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


# ---- images -------------------------------------------------------------------------------------------------------------

def until(check: Callable[[], bool], proc: subprocess.Popen, started: float, limit: float) -> float:
    """Seconds from `started` until `check()` holds, polling every 5 ms; fails if `proc` exits first."""
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before it was ready")
        if time.perf_counter() - started > limit:
            raise RuntimeError(f"{proc.args} not ready after {limit}s")
        time.sleep(0.005)
    return time.perf_counter() - started


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as response:
            return response.status == 200
    except OSError:
        return False


def images(args: argparse.Namespace, work: Path) -> str:
    buildah = shlex.split(args.buildah)
    if not args.images or shutil.which(buildah[0]) is None:
        return "#### Images' cold start\n\nNot run: give built images with --images (and have buildah).\n"

    def call(*a: str) -> str:
        return subprocess.run([*buildah, *a], check=True, capture_output=True, text=True).stdout.strip()

    def inside(container: str, *argv: str) -> list[str]:  # host networking: the host reaches the server's port
        return [*buildah, "run", "--isolation", "chroot", "--network", "host", "-v", f"{work}:/cs", container, "--", *argv]

    def timed(argv: list[str]) -> tuple[float, str]:
        started = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        return time.perf_counter() - started, out

    def du(path: Path) -> int:
        return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])

    work.chmod(0o777)  # the images run as uid 10001
    _runs.write_job(work / "job.yaml", "cold-start", {"workers": 1, "model": {"type": "pmf"},
                                                      "dataset": {"uri": "/cs/data"}, "stop": {"maxSteps": 20}})
    containers, facts, samples = {}, {}, {image: {} for image in args.images}
    try:
        for image in args.images:
            started = time.perf_counter()
            containers[image] = call("from", "--pull-never", image)
            created = time.perf_counter() - started
            root = Path(call("mount", containers[image]))
            facts[image] = (du(root), du(root / "opt/mlless"), [p for p in ROLE_PACKAGES if (root / SITE / p).is_dir()],
                            created)
            call("umount", containers[image])
        if not (work / "data" / "manifest.json").exists():
            subprocess.run(inside(containers[args.images[0]], "mlless", "prepare", "--synthetic", "pmf", "--rows",
                                  "20000", "--out", "/cs/data", "--quiet"), check=True, stdout=subprocess.DEVNULL)
        for r in range(args.repeats or (1 if args.quick else 5)):
            for n, image in enumerate(args.images):
                c, s = containers[image], samples[image]
                s.setdefault("start", []).append(timed(inside(c, "true"))[0])
                s.setdefault("import", []).append(float(timed(inside(c, "python", "-c", IMPORT_SCRIPT))[1]))
                if healthy(args.port):
                    raise RuntimeError(f"something already answers on port {args.port}: pick another with --port")
                started = time.perf_counter()
                # `timeout` ends the server from inside the container, as SIGTERM ends it in a pod; it is never invoked
                server = subprocess.Popen(inside(c, "timeout", "-s", "TERM", "10", "env", f"REDIS_URL={_common.REDIS}",
                                                 f"AMQP_URL={_common.AMQP}", "mlless", "worker-server", "--host",
                                                 "127.0.0.1", "--port", str(args.port)),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                s.setdefault("ready", []).append(until(lambda: healthy(args.port), server, started, 10))
                server.wait(timeout=40)
                run_dir = work / f"run-{n}-{r}"
                shutil.rmtree(run_dir, ignore_errors=True)
                started = time.perf_counter()
                train = subprocess.Popen(inside(c, "mlless", "train", "/cs/job.yaml", "--out", f"/cs/{run_dir.name}",
                                                "-q"), stdout=subprocess.DEVNULL)
                s.setdefault("first", []).append(until(lambda: _runs.recorded(run_dir) > 0, train, started, 120))
                if train.wait(timeout=120) != 0:
                    raise RuntimeError(f"mlless train in {image} failed")
    finally:
        for c in containers.values():
            subprocess.run([*buildah, "rm", c], capture_output=True)
    rows = [[f"`{image}`", f"{rootfs / 1e6:.0f}", f"{venv / 1e6:.0f}", ", ".join(packages) or "none", f"{created:.1f}",
             *(spread(samples[image][k]) for k in ("start", "import", "ready", "first"))]
            for image, (rootfs, venv, packages, created) in facts.items()]
    return "\n".join([f"#### Images' cold start ({call('--version')}, vfs storage, chroot isolation)", "",
                      _common.table(["image", "rootfs MB", "/opt/mlless MB", "kopf / kubernetes / matplotlib",
                                     "create s", "container start s", "import mlless.cli s", "server ready s",
                                     "first step s"], rows), ""])


# ---- forked workers -------------------------------------------------------------------------------------------------------

def forked(args: argparse.Namespace, work: Path) -> str:
    data = _common.prepared(args.data_dir, "movielens")
    job = _runs.write_pmf_job(work / "forked.yaml", name="forked", workers=2, data=data, protocol="bsp",
                              stop={"maxEpochs": 1})
    got: dict[str, list[dict[str, Any]]] = {"forked from a zygote": [], "new interpreters": []}
    for r in range(args.repeats or (1 if args.quick else 3)):
        for how, env in (("forked from a zygote", {}), ("new interpreters", {"MLLESS_ZYGOTE": "0"})):
            run_dir = _runs.mlless_train(job, work / f"forked-{len(env)}-{r}-{int(time.time() * 1000) % 10**8}",
                                         False, env=env)
            s = _runs.summary(run_dir)
            pricing = json.loads((run_dir / "job.json").read_text())["pricing"]
            billed = s["cost_breakdown_usd"]["workers"] / (pricing["function_memory_gb"] * pricing["price_per_gb_second"])
            got[how].append({"startup": s["startup_seconds"], "wall": s["wall_seconds"], "billed": billed,
                             "cost": s["cost_usd"]})
    rows = [[how, *(spread([r[k] for r in runs]) for k in ("startup", "wall", "billed")),
             f"{statistics.median(r['cost'] for r in runs):.6f}"] for how, runs in got.items()]
    return "\n".join(["#### Forked workers: 1-epoch PMF on the MovieLens sample, P = 2, embedded", "",
                      _common.table(["workers", "start-up s", "wall s", "worker-seconds billed", "cost $ (median)"],
                                    rows), ""])


# ---- HTTP invocations --------------------------------------------------------------------------------------------------

def invoked(job_file: Path, base: Path, timeout: float | None, http: bool) -> dict[str, Any]:
    """The job run by a supervisor in this process, its workers local processes or HTTP invocations of a server."""
    from mlless.contract import ENV_IDENTITY
    from mlless.protocol.identity import ANY_WORKER, SUPERVISOR, Issuer
    from mlless.launch.launcher import HttpLauncher, Launcher, LocalLauncher
    from mlless.runtime.local import new_job_id
    from mlless.runtime.supervisor.loop import Supervisor
    from mlless.spec import load_manifest
    from mlless.transport import connect

    job = load_manifest(job_file)
    job_id, issuer = new_job_id("bench-invoke"), Issuer()
    run_dir = base / f"invoke-{timeout}-{int(time.time() * 1000) % 10**8}"
    run_dir.mkdir(parents=True)
    env = {"MLLESS_JOB_ID": job_id, "REDIS_URL": _common.REDIS, "AMQP_URL": _common.AMQP}
    server = None
    launcher: Launcher
    if http:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "mlless", "worker-server", "--port", str(port), "--concurrency",
                                   str(job.workers)], stdout=(run_dir / "server.log").open("wb"), stderr=subprocess.STDOUT,
                                  env={**os.environ, **env, ENV_IDENTITY: issuer.issue(ANY_WORKER).text()})
        until(lambda: healthy(port), server, time.perf_counter(), 30)
        launcher = HttpLauncher(f"http://127.0.0.1:{port}/", job, job_id, timeout_seconds=timeout or 3600)
    else:
        (run_dir / "job.json").write_text(job.to_json())
        launcher = LocalLauncher(run_dir / "job.json", env, run_dir / "logs", issuer)
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
    return {"wall": wall, "steps": summary["steps"], "invocations": invocations, "rmse": summary["validation_loss"]}


def http(args: argparse.Namespace, work: Path) -> str:
    workers, steps = 3, args.steps or (600 if args.quick else 3000)
    job = _runs.write_pmf_job(work / "invoke.yaml", name="bench-invoke", workers=workers,
                              data=_common.prepared(args.data_dir, "movielens"), protocol="isp", stop={"maxSteps": steps})
    timeouts = args.timeouts or ([20.0] if args.quick else [30.0, 15.0])
    results = [("processes", invoked(job, work, None, False)), ("http", invoked(job, work, None, True))]
    results += [(f"http, timeout {t:g} s", invoked(job, work, t, True)) for t in timeouts]
    baseline, rows = results[1][1], []
    for label, r in results:
        again = r["invocations"] - workers
        per = (r["wall"] - baseline["wall"]) / again if label.startswith("http") and again > 0 else None
        rows.append([label, r["steps"], _common.fmt(r["wall"], 1), r["invocations"], _common.fmt(per, 2),
                     _common.fmt(r["rmse"])])
        print("  ", rows[-1], flush=True)
    return "\n".join([f"#### HTTP invocations: PMF, MovieLens sample, {workers} workers, ISP, {steps} steps, Redis + "
                      "RabbitMQ on loopback", "",
                      _common.table(["launcher", "steps", "wall s", "invocations", "s per checkpoint + re-invocation",
                                     "val RMSE"], rows), ""])


# ---- warm start -----------------------------------------------------------------------------------------------------------

def old_ratings(full: Path, out: Path, fraction: float) -> Path:
    """A data set of `full`'s first `fraction` of training batches (shuffled rows: a random share of the ratings),
    with the same dimensions and validation split."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(full, out)
    manifest = json.loads((out / "manifest.json").read_text())
    keep = int(manifest["n_batches"] * fraction)
    for name in [f"train/batch-{i:06d}.npz" for i in range(keep, manifest["n_batches"])]:
        (out / name).unlink()
        manifest["checksums"].pop(name, None)
    manifest["n_train"] = keep * manifest["batch_size"]  # only the last batch is short, and it is dropped
    manifest["n_batches"] = keep
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return out


def warm(args: argparse.Namespace, work: Path) -> str:
    workers, epochs, fraction = 2, 3.0 if args.quick else 6.0, 0.8
    full = _common.prepared(args.data_dir, "movielens")

    def train(name: str, data: Path, init_from: Path | None = None) -> Path:
        model: dict[str, Any] = {"type": "pmf", **({"initFrom": str(init_from)} if init_from else {})}
        job = _runs.write_job(work / f"{name}.yaml", name, {
            "workers": workers, "model": model, "dataset": {"uri": str(data), "cacheBatches": True},
            "sync": {"protocol": "isp"}, "stop": {"maxEpochs": epochs}, "evaluation": {"everySteps": 5}})
        return _runs.mlless_train(job, work / f"run-{name}-{int(time.time() * 1000) % 10**8}", False)

    first = train("old", old_ratings(full, work / "old-ratings", fraction))
    rows = []
    for repeat in range(args.repeats or (1 if args.quick else 2)):
        curves = {name: [(r["step"], r["epoch"], r["time"], r["validation_loss"])
                         for r in _runs.rows(train(name, full, first if name == "warm" else None))
                         if r.get("validation_loss") is not None] for name in ("cold", "warm")}
        target = min(loss for *_, loss in curves["cold"]) + args.slack
        for name, points in curves.items():
            hit = next(((s, e, t) for s, e, t, loss in points if loss <= target), (None, None, None))
            rows.append((repeat + 1, name, target, points[0][3], *hit, min(loss for *_, loss in points)))
    return "\n".join([
        f"#### Warm start: PMF on the MovieLens sample, P = {workers}, ISP, {epochs:g} epochs, evaluated every 5 "
        f"steps; the old model trained on {fraction:.0%} of the ratings (validation RMSE "
        f"{_runs.summary(first)['validation_loss']:.4f})", "",
        "model.npz holds no optimizer state: the warm job's per-sample AdaGrad starts from empty accumulators, so its "
        "first steps are as large as a cold job's. Target: the cold run's best + the slack; compare a repeat's rows.", "",
        _common.table(["repeat", "start", "target", "first evaluation", "step at target", "epochs at target",
                       "seconds at target", "best"], rows), ""])

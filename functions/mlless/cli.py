"""The `mlless` command line."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from mlless.contract import (
    ENV_DEADLINE_SECONDS,
    ENV_EMBEDDED_ADDRESS,
    ENV_JOB_FILE,
    ENV_JOB_ID,
    ENV_METRICS_PORT,
    ENV_RANK,
    ENV_RESUME,
    EXIT_CHECKPOINTED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    FUNCTION_PORT,
    OPERATOR_HEALTH_PORT,
    STOP_INTERRUPTED,
    SUPERVISOR_METRICS_PORT,
)
from mlless import __version__
from mlless.data.cli import add_prepare_parser
from mlless.data.dataset import Dataset, DatasetError
from mlless.training.models import ModelFileError, load_model
from mlless.training.warm_start import initial_model
from mlless.telemetry.report.cli import add_report_parser
from mlless.planning.cli import add_parser as add_plan_parser
from mlless.runtime import sweep_cli
from mlless.launch.launcher import Launcher
from mlless.progress import Progress
from mlless.runtime.attack import ATTACK_HELP, AttackError, checked_attack
from mlless.runtime.supervisor.failover import ResumeError, failed, resumable
from mlless.runtime.supervisor.membership import JobFailed
from mlless.plugins import load_plugins
from mlless.spec import SpecError, TrainingJob, load_manifest
from mlless.spec.models import model_type
from mlless.transport import TransportError

log = logging.getLogger("mlless")


class UsageError(Exception):
    """Bad command-line input; printed without a traceback."""


def _load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainingJob:
    """A TrainingJob from a manifest (YAML; `overrides` replace spec fields before validation) or from the
    resolved JSON a launcher wrote."""
    path = Path(path)
    load_plugins()  # what MLLESS_PLUGINS names registers itself, and validation admits its names
    if path.suffix == ".json":
        try:
            return TrainingJob.from_json(path.read_text())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise SpecError(f"{path}: not a resolved job file: {exc}") from None
    return load_manifest(path, overrides)


def _check_fit(source: str, job: TrainingJob, dataset: Dataset) -> None:
    """UsageError naming the field if `dataset` does not fit the job's model (`ModelType.dataset_errors`)."""
    for error in model_type(job.model.type).dataset_errors(job.model.options, dataset)[:1]:
        raise UsageError(f"{source}: {error}")


def service_args(args: argparse.Namespace) -> tuple[str | None, str | None]:
    from mlless.runtime.local import services_from

    try:
        services = services_from(args.redis_url, args.amqp_url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return services.redis_url, services.amqp_url


def add_service_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", metavar="URL", action="append",
                   help="Redis for model updates (default: $REDIS_URL; none: embedded transport); repeat it to shard "
                        "the job's keys over several Redis instances")
    p.add_argument("--amqp-url", metavar="URL", help="RabbitMQ for control messages (default: $AMQP_URL)")


# ---- commands ------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from mlless.runtime.local import ISSUER_FILE, Services, resumed_job_id, train_local

    # --workers goes through the schema like the manifest's own field, and the defaults that depend on P follow it.
    job = _load_job(args.job, {"workers": args.workers} if args.workers is not None else None)
    dataset = Dataset.open(job.dataset_uri)
    _check_fit(args.job, job, dataset)
    if job.model.init_from:
        initial_model(job, dataset)  # a warm start that does not fit is refused before anything starts
    redis_url, amqp_url = service_args(args)
    if args.resume and not args.out:
        raise UsageError("--resume continues the job of a run directory: give it with --out RUNDIR")
    run_dir = Path(args.out or f"runs/{job.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if not (args.resume or args.force) and (run_dir / ISSUER_FILE).exists():
        raise UsageError(f"{run_dir}: holds a job that can still be resumed; continue it with --resume, or start "
                         "over with --force (its record and issuer are replaced)")
    job_id = resumed_job_id(run_dir) if args.resume else None
    progress = Progress(enabled=not args.quiet)
    progress.message(
        f"{f'resuming job {job_id}: ' if job_id else ''}training {job.model.type} with {job.workers} workers on "
        f"{job.dataset_uri} ({'Redis + RabbitMQ' if redis_url else 'embedded transport'}); run directory {run_dir}"
    )
    summary = train_local(job, run_dir, Services(redis_url, amqp_url), progress, args.metrics_port, job_id,
                          attack=checked_attack(args.attack, job.workers))
    _print_summary(summary, progress)
    if resumable(summary["stop_reason"]):
        print(f"mlless: to go on: mlless train {args.job} --out {run_dir} --resume", file=sys.stderr)
    if summary["stop_reason"] == STOP_INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if failed(summary) else 0


def _print_summary(summary: dict[str, Any], progress: Progress) -> None:
    metric = summary["loss_metric"]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    progress.message(
        f"done ({summary['stop_reason']}): {summary['steps']} steps, {summary['epochs']:.2f} epochs in "
        f"{summary['wall_seconds']:.1f}s\n"
        f"  train {metric} {fmt(summary['train_loss'])}, validation {metric} {fmt(summary['validation_loss'])}"
        + "".join(f", {name} {fmt(value)}" for name, value in summary["validation_scores"].items()) + "\n"
        f"  workers {summary['workers_initial']} -> {summary['workers_final']}, "
        f"{summary['bytes_sent'] / 1e6:.1f} MB of updates, cost ${summary['cost_usd']:.5f}\n"
        f"  model: {summary['model_path']}{_model_origin(summary)}"
    )
    for drop in summary["dropped_workers"]:
        progress.message(f"  worker {drop['rank']} was dropped at step {drop['step']}: {drop['reason']}")
    if summary["repaired_frames"]:
        progress.message(f"  {summary['repaired_frames']} update frames Redis lost were published again and applied")
    if summary["rejected_frames"]:
        progress.message(f"  {summary['rejected_frames']} frames were rejected (see the logs)")


def _model_origin(summary: dict[str, Any]) -> str:
    """Say so when the saved model is an earlier snapshot rather than the final replicas."""
    if summary["validation_loss"] is None:
        return ""
    if summary.get("final_validation_loss") is None:
        return f" (the best snapshot, step {summary['model_step']}: no final replica survived)"
    if summary["validation_loss"] == summary["final_validation_loss"]:
        return ""
    return (f" (the best snapshot, step {summary['model_step']}; the final replicas scored "
            f"{summary['final_validation_loss']:.4f})")


def cmd_evaluate(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    dataset = Dataset.open(args.dataset)
    if dataset.kind != model.dataset_kind:
        raise UsageError(f"{args.dataset}: a {dataset.kind} dataset cannot evaluate a {model.kind} model")
    if not dataset.fits(model.type.labels):
        raise UsageError(f"{args.dataset}: it holds {dataset.label_set()}, and a {model.kind} model fits "
                         f"{' or '.join(sorted(model.type.labels))} labels")
    shape = {k: v for k, v in model.dims().items() if k in model.shape_dims}
    theirs = {k: dataset.dims().get(k) for k in shape}
    if shape != theirs:
        raise UsageError(f"{args.dataset}: the dataset has {theirs}, the model {args.model} was trained on {shape}")
    splits = {"validation": dataset.validation()}
    if args.train:
        splits["train"] = [dataset.batch(i) for i in range(dataset.n_batches)]
    result: dict[str, Any] = {"metric": model.loss_metric}
    for name, data in splits.items():
        batches = data if isinstance(data, list) else [data]
        loss_sum = n = 0
        for batch in batches:
            s, k = model.evaluate(batch)
            loss_sum, n = loss_sum + s, n + k
        result[name] = model.loss(loss_sum, n)
        result[f"{name}_samples"] = n
        if not isinstance(data, list):  # the figures of a whole split at once (AUC ranks every row)
            result |= {f"{name}_{metric}": value for metric, value in model.scores(data).items()}
    print(json.dumps(result, indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    job = _load_job(args.job)
    try:
        dataset = Dataset.open(job.dataset_uri)
    except DatasetError:  # not there to read (yet): the manifest alone is checked
        pass
    else:
        _check_fit(args.job, job, dataset)
    print(json.dumps(json.loads(job.to_json()), indent=2))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from mlless.runtime.worker import serve
    from mlless.transport import connect

    job_file = args.job or os.environ.get(ENV_JOB_FILE)
    rank = args.rank if args.rank is not None else os.environ.get(ENV_RANK)
    job_id = args.job_id or os.environ.get(ENV_JOB_ID)
    if not (job_file and rank is not None and job_id):
        raise UsageError("a worker needs --job/MLLESS_JOB_FILE, --rank/MLLESS_RANK and --job-id/MLLESS_JOB_ID")
    job = _load_job(job_file)
    redis_url, amqp_url = service_args(args)
    embedded = os.environ.get(ENV_EMBEDDED_ADDRESS)
    if not redis_url and not embedded:
        raise UsageError("a worker needs --redis-url/--amqp-url or MLLESS_EMBEDDED_ADDRESS")
    deadline_seconds = args.deadline_seconds if args.deadline_seconds is not None else os.environ.get(ENV_DEADLINE_SECONDS)
    deadline = time.monotonic() + float(deadline_seconds) if deadline_seconds else None
    resume = args.resume or os.environ.get(ENV_RESUME) == "1"
    transport = connect(job_id, role="worker", rank=int(rank), redis_url=redis_url, amqp_url=amqp_url, embedded_address=embedded)
    return serve(job, int(rank), transport, deadline=deadline, resume=resume)


def cmd_zygote(args: argparse.Namespace) -> int:
    """Not for users: the local launcher's warm process, which forks workers on its requests (launch/zygote.py)."""
    import mlless.runtime.worker  # noqa: F401  what `cmd_worker` imports, once for every fork
    from mlless.launch.zygote import serve

    for name in filter(None, args.imports.split(",")):
        with contextlib.suppress(ImportError):  # a worker that needs it says so itself, in one line
            importlib.import_module(name)

    return serve(args.fd, lambda: main(["worker"]))


def cmd_worker_server(args: argparse.Namespace) -> int:
    from mlless.runtime.function_server import serve_functions

    return serve_functions(args.port, args.concurrency, host=args.host)


def _worker_launcher(job: TrainingJob, job_id: str) -> Launcher:
    """How the supervisor reaches its workers, from what the operator put in its environment."""
    from mlless.launch.launcher import worker_launcher

    try:
        return worker_launcher(os.environ, job, job_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_supervisor(args: argparse.Namespace) -> int:
    try:
        from kubernetes.config import ConfigException
    except ImportError:
        raise UsageError("`mlless supervisor` needs the kubernetes client: pip install 'mlless[supervisor]'") from None

    from mlless.launch.kube import KubePlatform
    from mlless.runtime.local import supervise
    from mlless.transport import connect

    job_file = args.job or os.environ.get(ENV_JOB_FILE)
    job_id = args.job_id or os.environ.get(ENV_JOB_ID)
    if not (job_file and job_id):
        raise UsageError("the supervisor needs --job/MLLESS_JOB_FILE and --job-id/MLLESS_JOB_ID")
    job = _load_job(job_file)
    redis_url, amqp_url = service_args(args)
    if not redis_url:
        raise UsageError("the supervisor needs --redis-url and --amqp-url (or REDIS_URL and AMQP_URL)")
    launcher = _worker_launcher(job, job_id)
    try:
        platform = KubePlatform.from_env(desired=job.workers)
    except (ConfigException, OSError) as exc:
        raise UsageError(f"MLLESS_JOB_NAME is set, but there is no usable Kubernetes configuration: {exc}") from None
    transport = connect(job_id, role="supervisor", redis_url=redis_url, amqp_url=amqp_url)
    progress = Progress(enabled=not args.quiet)
    # The operator restarts a supervisor pod that failed: its successor takes over from the state in Redis.
    summary = supervise(job, job_id, transport, launcher, Path(args.out), progress, args.metrics_port, platform,
                        successor=True)
    _print_summary(summary, progress)
    return EXIT_FAILED if failed(summary) else 0


def cmd_operator(args: argparse.Namespace) -> int:
    """The operator is a program of its own (`mlless-operator`, `python -m mlless_operator`), which this package never
    imports (tests/test_layering.py): run it in this process's place."""
    os.execv(sys.executable, [sys.executable, "-m", "mlless_operator"])


# ---- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlless",
        description="Serverless machine-learning training (MLLess): a supervisor and P worker functions "
        "that exchange significant updates through Redis and control messages through RabbitMQ.",
    )
    parser.add_argument("--version", action="version", version=f"mlless {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train",
        help="run a TrainingJob on this machine",
        description="Run a TrainingJob manifest locally: the supervisor in this process, each worker a separate "
        "process. Without --redis-url/--amqp-url it uses the embedded transport and needs no services.",
    )
    p.add_argument("job", metavar="JOB.yaml", help="TrainingJob manifest (the file you would kubectl apply)")
    p.add_argument("--workers", type=int, metavar="N", help="override spec.workers")
    p.add_argument("--out", metavar="RUNDIR", help="run directory (default: runs/NAME-TIMESTAMP)")
    p.add_argument("--resume", action="store_true",
                   help="continue the job in --out RUNDIR after a crash, a kill or a Ctrl-C: steps, the run record "
                        "and the cost carry on from its newest checkpoint, or from its surviving workers")
    p.add_argument("--force", action="store_true",
                   help="start a new job in --out RUNDIR even if it holds one that can be resumed")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on this port while training")
    p.add_argument("--attack", metavar="RANK=KIND", help=ATTACK_HELP)
    add_service_args(p)
    p.set_defaults(func=cmd_train)

    add_prepare_parser(sub)

    add_report_parser(sub)
    sweep_cli.add_parser(sub)

    add_plan_parser(sub, add_service_args, service_args)

    p = sub.add_parser("evaluate", help="evaluate a saved model on a prepared dataset")
    p.add_argument("model", metavar="MODEL", help="model.npz written by a run")
    p.add_argument("dataset", metavar="DATASET", help="directory or URL written by `mlless prepare`")
    p.add_argument("--train", action="store_true", help="also evaluate on the training batches")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("validate", help="check a TrainingJob manifest and print it with defaults resolved")
    p.add_argument("job", metavar="JOB.yaml")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "worker",
        help="run one worker function (what a worker pod runs)",
        description="Run worker RANK of a job until the supervisor finishes it. Settings come from the flags or "
        "from MLLESS_JOB_FILE, MLLESS_RANK, MLLESS_JOB_ID, REDIS_URL, AMQP_URL / MLLESS_EMBEDDED_ADDRESS.",
    )
    p.add_argument("--job", metavar="FILE", help="TrainingJob manifest or resolved job.json")
    p.add_argument("--rank", type=int)
    p.add_argument("--job-id")
    p.add_argument(
        "--deadline-seconds",
        type=float,
        metavar="S",
        help=f"checkpoint to Redis and exit with code {EXIT_CHECKPOINTED} before S seconds have passed (default $MLLESS_DEADLINE_SECONDS; none: run to the end)",
    )
    p.add_argument("--resume", action="store_true", help="continue from this rank's checkpoint (default: $MLLESS_RESUME=1)")
    add_service_args(p)
    p.set_defaults(func=cmd_worker)

    # Unlisted (no help): started by `mlless train` and `mlless sweep` with the socket they talk to it over.
    p = sub.add_parser("zygote")
    p.add_argument("fd", type=int)
    p.add_argument("--import", dest="imports", default="")
    p.set_defaults(func=cmd_zygote)

    p = sub.add_parser(
        "worker-server",
        help="serve worker invocations over HTTP (what a Knative or OpenFaaS worker container runs)",
        description="An HTTP function: each POST / runs one worker rank until the job ends for it or until the "
        "invocation's deadline, when the worker checkpoints to Redis and the supervisor invokes it again. "
        "Redis and RabbitMQ come from REDIS_URL and AMQP_URL, or from the files redis-url and amqp-url in "
        "$MLLESS_SECRETS_DIR; MLLESS_JOB_ID, if set, is the only job it accepts; with MLLESS_INVOKE_TOKEN (or the file "
        "invoke-token there) a request must carry Authorization: Bearer <token>.",
    )
    p.add_argument("--port", type=int, default=FUNCTION_PORT, help=f"port to listen on (default {FUNCTION_PORT})")
    p.add_argument("--host", default="", help="address to listen on (default: every interface, as a container's "
                   "port must be; 127.0.0.1 keeps it on this machine)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="invocations at a time; more get 429 (default 1)")
    p.set_defaults(func=cmd_worker_server)

    p = sub.add_parser(
        "supervisor",
        help="run the supervisor of a job whose workers are started elsewhere (what the supervisor pod runs)",
    )
    p.add_argument("--job", metavar="FILE", help="TrainingJob manifest or resolved job.json (default $MLLESS_JOB_FILE)")
    p.add_argument("--job-id", help="job id shared with the workers (default $MLLESS_JOB_ID)")
    p.add_argument("--out", default="run", metavar="RUNDIR", help="run directory (default: ./run)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get(ENV_METRICS_PORT, SUPERVISOR_METRICS_PORT)),
        metavar="N",
        help=f"Prometheus metrics port (default $MLLESS_METRICS_PORT or {SUPERVISOR_METRICS_PORT}; 0 = any free port)",
    )
    p.add_argument("-q", "--quiet", action="store_true")
    add_service_args(p)
    p.set_defaults(func=cmd_supervisor)

    p = sub.add_parser(
        "operator",
        help=f"run the Kubernetes operator (`mlless-operator`: kopf --standalone, liveness on :{OPERATOR_HEALTH_PORT}/healthz)",
        description="Run the TrainingJob operator. Settings come from MLLESS_OPERATOR_* variables (see charts/mlless/README.md).",
    )
    p.set_defaults(func=cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        # pika warns about returned messages and cancelled consumers, which the transport handles itself.
        logging.getLogger("pika").setLevel(logging.ERROR)
    try:
        return args.func(args)
    except (SpecError, DatasetError, UsageError, ModelFileError, AttackError) as exc:
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (TransportError, JobFailed, ResumeError) as exc:
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("mlless: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`mlless validate job.yaml | head`): say nothing more, and keep Python from
        # failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

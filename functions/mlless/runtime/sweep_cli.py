"""The `mlless sweep` subcommand: a TrainingSweep manifest run on this machine (`mlless.runtime.sweep`)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mlless.contract import EXIT_USAGE
from mlless.data.dataset import Dataset
from mlless.spec import SpecError
from mlless.spec.models import model_type
from mlless.progress import Progress
from mlless.contract import SWEEP_BEST_DIR as BEST_DIR, SWEEP_STATUS_FILE as STATUS_FILE, SWEEP_TRIALS_DIR as TRIALS_DIR
from mlless.sweep.manifest import Sweep, load_sweep
from mlless.sweep.status import table


def run(args: argparse.Namespace) -> int:
    # Imported here: every `mlless` process (a worker too) builds the parser, and only a sweep needs the runtime.
    from mlless.runtime.local import services_from
    from mlless.runtime.sweep import LocalSweep

    sweep = load_sweep(args.sweep)  # every bad field is refused here, before a trial starts
    check_dataset(sweep, args.sweep)
    out = Path(args.out or f"runs/{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        services = services_from(args.redis_url, args.amqp_url)
    except ValueError as exc:
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    progress = Progress(enabled=not args.quiet)
    progress.message(f"sweep {sweep.name}: {sweep.max_trials} trials, {sweep.max_concurrent} at a time, early "
                     f"stopping {sweep.early_stopping.type}; sweep directory {out}")
    status = LocalSweep(sweep, out, services, progress.message).run()
    progress.message(table(status))
    best = status.get("bestTrial")
    progress.message(f"sweep cost ${status['costUSD']:.5f}; " + (
        f"best trial {best} (validation {status['bestValidationLoss']:.4f}), model {status['bestModelURI']}"
        if best else "no trial produced a model") + (f"\n{status['message']}" if status.get("message") else ""))
    return 0 if best else 1


def check_dataset(sweep: Sweep, source: str) -> None:
    """Refuse in one line, as `mlless train` refuses a job's, a dataset the trials share that is missing or does
    not fit one of them (a `clusters` value above its rows), before any trial starts."""
    dataset = None
    for i, values in enumerate(sweep.assignments()):
        job = sweep.trial_job(sweep.trial_name(i), values, source)
        dataset = dataset or Dataset.open(job.dataset_uri)
        for error in model_type(job.model.type).dataset_errors(job.model.options, dataset)[:1]:
            raise SpecError(f"{source}: trial {job.name}: {error}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a TrainingSweep on this machine: trials over a search space, losers stopped early (ASHA)",
        description="Run a TrainingSweep manifest locally. Each trial is a local TrainingJob in its own run directory "
        f"(DIR/{TRIALS_DIR}/NAME), up to spec.maxConcurrentTrials at once; ASHA stops the trials whose validation loss "
        f"falls behind at its rungs. DIR/{STATUS_FILE} holds the trials table (rewritten as it changes), and DIR/{BEST_DIR} "
        "the best trial's model and record. `mlless report DIR` plots the trials.",
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="TrainingSweep manifest (the file you would kubectl apply)")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default: runs/NAME-TIMESTAMP)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--redis-url", metavar="URL", help="Redis for the trials (default: $REDIS_URL; none: embedded)")
    p.add_argument("--amqp-url", metavar="URL", help="RabbitMQ for the trials (default: $AMQP_URL)")
    p.set_defaults(func=run)

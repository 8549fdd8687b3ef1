"""`python -m benchmarks SUITE [--quick] [--data-dir DIR] [--out DIR] [the suite's options]`.

Runs one suite: prints its progress and then its report (the machine's header, the command, the machine's load at
the start and the end, the suite's tables), and writes the report to OUT/report.md (with any raw figures the suite
keeps, e.g. scaling.json). Nothing is written under benchmarks/.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from . import _common

#: name: (module, the question it answers). The order is the README's.
SUITES = {
    "time-to-quality": ("time_to_quality", "seconds and epochs to a target validation loss, mlless with its defaults "
                                           "against LIBMF, Surprise, PyTorch, Vowpal Wabbit and scikit-learn"),
    "scaling": ("scaling", "does a second and third worker pay: P = 1, 2, 3 per protocol x exchange, worker "
                           "CPU-seconds, LIBMF/VW in the same run, and the projection to a cluster"),
    "exchange": ("exchange", "bytes and time of the exchange: patterns as a dense model grows, in-store merging, "
                             "Redis sharding, an update's wire and sealing cost, per-step protocol overhead"),
    "paper": ("paper", "the papers' claims: ISP vs BSP vs SSP, the scale-in auto-tuner, mlless vs PyTorch DDP, "
                       "on loopback and behind a rate-limited link"),
    "networks": ("networks", "PyTorch networks: mlless's overhead over a plain loop at P = 1, time to target against "
                             "PyTorch DDP, whether a second worker pays, gradient vs model averaging, the exchange's "
                             "cost per step"),
    "robustness": ("robustness", "robust aggregation's cost, the final merge of replicas, service faults and "
                                 "supervisor failover"),
    "forecast": ("forecast", "how right the ETA, the stop rule's projection, `mlless plan` and ASHA are"),
    "startup": ("startup", "what starting costs: images' cold start, forked workers, HTTP invocations, warm start"),
    "fuzz": ("fuzz", "coverage-guided fuzzing (atheris) of every parser of untrusted input"),
}


def top_parser() -> argparse.ArgumentParser:
    width = max(map(len, SUITES))
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[1],
        epilog="suites:\n" + "\n".join(f"  {name:<{width}}  {question}" for name, (_, question) in SUITES.items())
               + "\n\n`python -m benchmarks SUITE --help` gives a suite's options.")
    p.add_argument("suite", choices=SUITES, metavar="SUITE", help="one of: " + ", ".join(SUITES))
    p.add_argument("options", nargs=argparse.REMAINDER, help="--quick, --data-dir, --out and the suite's options")
    return p


def suite_parser(name: str, module: object) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the small version: under 5 minutes on 2 cores")
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="prepared data sets and runs (default %(default)s, or $MLLESS_BENCH_DATA)")
    p.add_argument("--out", type=Path, help="the report's directory (default DATA_DIR/reports/SUITE)")
    module.add_arguments(p)  # type: ignore[attr-defined]
    return p


def main(argv: list[str] | None = None) -> int:
    top = top_parser().parse_args(argv)
    module_name, question = SUITES[top.suite]
    module = importlib.import_module(f"benchmarks.{module_name}")
    args = suite_parser(top.suite, module).parse_args(top.options)
    args.out = args.out or args.data_dir / "reports" / top.suite
    args.out.mkdir(parents=True, exist_ok=True)
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    started = time.perf_counter()
    failed = False
    try:
        body = module.run(args)  # type: ignore[attr-defined]
    except _common.Failed as exc:
        body, failed = str(exc), True
    minutes = (time.perf_counter() - started) / 60
    report = "\n".join([
        f"## {top.suite}: {question}", "",
        f"Machine: {_common.machine_line(info)}.", "",
        f"Command: `{_common.command_line()}` ({minutes:.1f} min). {_common.load_note(info['load'], _common.loadavg())}",
        "", body.rstrip(), ""])
    (args.out / "report.md").write_text(report)
    print("\n" + report + f"\n(written to {args.out / 'report.md'})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

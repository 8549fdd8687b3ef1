"""The `mlless report` subcommand.

It registers itself on the main parser's subparsers (`add_report_parser`)
and handles its own input errors, printing `mlless: error: ...` and
returning 2 like the rest of the CLI does for bad input.
"""
from __future__ import annotations

import argparse
import sys

from mlless.contract import EXIT_USAGE
from mlless.telemetry.report.rundirs import ReportError, load_runs


def cmd_report(args: argparse.Namespace) -> int:
    try:
        # matplotlib loads only when a report is made
        from mlless.telemetry.report.html import render_report
        from mlless.telemetry.report.sweep import is_sweep_dir, render_sweep_report
    except ImportError:
        print("mlless: error: `mlless report` needs matplotlib: pip install 'mlless[report]'", file=sys.stderr)
        return EXIT_USAGE

    try:
        if len(args.rundirs) == 1 and is_sweep_dir(args.rundirs[0]):
            index, trials = render_sweep_report(args.rundirs[0], args.out, args.title)
            print(f"report for the sweep's {trials} trial(s): {index}")
            return 0
        runs = load_runs(args.rundirs, args.label)
        index = render_report(runs, args.out, title=args.title)
    except ReportError as exc:
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # e.g. --out not writable
        print(f"mlless: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report for {len(runs)} run(s): {index}")
    return 0


def add_report_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="compare runs: an HTML page with loss, workers, cost, bytes and step-time plots",
        description="Write an HTML report (index.html plus one PNG per plot) comparing run directories written "
        "by `mlless train`: losses over time, workers over time, loss against cumulative cost, update bytes per "
        "step, and the median step-time breakdown by phase. Reads only metrics.jsonl and summary.json. Given a sweep "
        "directory (`mlless sweep --out DIR`), it shows each trial's validation curve with the point where the sweep "
        "stopped it, and each parameter against the trials' best validation loss.",
    )
    p.add_argument("rundirs", nargs="+", metavar="RUNDIR",
                   help="run directory (holds metrics.jsonl and summary.json), or one sweep directory")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for index.html and the PNGs (created if missing)")
    p.add_argument(
        "--label", action="append", metavar="NAME",
        help="name of a run in legends and the table, once per RUNDIR in order (default: the directory name)",
    )
    p.add_argument("--title", default="mlless training report", help="page title")
    p.set_defaults(func=cmd_report)

"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser of untrusted input (#22).

The targets are tests/fuzz_targets.py's, which tests/test_fuzz.py runs under hypothesis in the default suite
(a few hundred examples each); here each runs for `--seconds` in a child process, from a corpus of valid
inputs and past findings, with mlless's code instrumented for coverage. A target fails if anything but its
parser's error escapes (a crash), or an input takes longer than `--timeout` (a hang), or more than `--rss-mb` of
memory: the suite then exits 1, the finding's input kept in --out (libFuzzer's crash-*/timeout-*/oom-* files).
The table: runs, executions per second, edges covered, and findings.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import _common

TESTS = _common.ROOT / "tests"
STATS = re.compile(r"stat::(\w+):\s+(\d+)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, help="per target (default 60; --quick 10)")
    p.add_argument("--targets", help="comma list (default: every target of tests/fuzz_targets.py)")
    p.add_argument("--timeout", type=int, default=5, help="seconds one input may take (default %(default)s)")
    p.add_argument("--rss-mb", type=int, default=2048, help="memory limit (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="libFuzzer's seed: 0 (the default) draws one; tests/test_fuzz.py fixes one, so it is repeatable")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1,
                   help="targets fuzzed at once (default: the CPUs, %(default)s)")


def child(name: str, seconds: float, timeout: int, rss_mb: int, seed: int, out: Path) -> None:
    import atheris

    sys.path.insert(0, str(TESTS))
    with atheris.instrument_imports(include=["mlless", "fuzz_targets"]):
        import fuzz_targets
    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    seeds = fuzz_targets.valid_seeds(corpus / "data")[name] + list(fuzz_targets.findings()[name].values())
    for k, data in enumerate(seeds):
        (corpus / f"seed-{k}").write_bytes(data)
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(seconds)}", f"-timeout={timeout}",
                   f"-rss_limit_mb={rss_mb}", "-print_final_stats=1", f"-seed={seed}", f"-artifact_prefix={out}/{name}-"],
                  fuzz_targets.TARGETS[name])
    atheris.Fuzz()


def run(args: argparse.Namespace) -> str:
    sys.path.insert(0, str(TESTS))
    from fuzz_targets import TARGETS

    seconds = args.seconds or (10.0 if args.quick else 60.0)
    names = args.targets.split(",") if args.targets else sorted(TARGETS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_common.ROOT), os.environ.get("PYTHONPATH")]))}

    def fuzz(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "benchmarks.fuzz", name, str(seconds), str(args.timeout),
                               str(args.rss_mb), str(args.seed), str(args.out)], capture_output=True, text=True, env=env)

    # A child spends more time instrumenting mlless's imports than fuzzing for a second: they run side by side.
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = dict(zip(names, pool.map(fuzz, names)))
    rows, failed = [], False
    for name, done in runs.items():
        stats = {k: int(v) for k, v in STATS.findall(done.stderr)}
        edges = re.findall(r"cov: (\d+)", done.stderr)
        finding = "none" if done.returncode == 0 else (re.findall(r"(crash|timeout|oom|leak)-\w+", done.stderr) or [
            f"exit {done.returncode}"])[0]
        failed |= done.returncode != 0
        # plain str cells: the counts without thousands separators, as tests/test_fuzz.py reads them
        rows.append([name, str(stats.get("number_of_executed_units", 0)), str(stats.get("average_exec_per_sec", 0)),
                     edges[-1] if edges else "?", finding])
        if done.returncode != 0:
            print(f"{name}:\n{done.stderr[-3000:]}", file=sys.stderr)
    text = f"{seconds:g} s per target.\n\n" + _common.table(["target", "runs", "exec/s", "edges covered", "finding"], rows)
    if failed:
        raise _common.Failed(text)
    return text


if __name__ == "__main__":  # a child: python -m benchmarks.fuzz NAME SECONDS TIMEOUT RSS_MB SEED OUT
    name, seconds, timeout, rss_mb, seed, out = sys.argv[1:7]
    child(name, float(seconds), int(timeout), int(rss_mb), int(seed), Path(out))

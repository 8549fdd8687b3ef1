"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser of untrusted input (#22).

The targets are tests/fuzz_targets.py's, which tests/test_fuzz.py runs under hypothesis in the default suite
(a few hundred examples each); here each runs for `--seconds` in a child process, from a corpus of valid
inputs, with mlless's code instrumented for coverage. A target fails if anything but its parser's error escapes
(a crash), or an input takes longer than `--timeout` (a hang), or more than `--rss-mb` of memory. Prints a
markdown table: runs, executions per second, edges covered, and findings; a finding's input is kept in
`--out` (libFuzzer's crash-*/timeout-*/oom-* files).

    python benchmarks/fuzz.py --seconds 60            # every target, a minute each
    python benchmarks/fuzz.py --targets batch --seconds 10
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

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
STATS = re.compile(r"stat::(\w+):\s+(\d+)")


def child(name: str, seconds: float, timeout: int, rss_mb: int, seed: int, out: Path) -> None:
    import atheris

    sys.path.insert(0, str(TESTS))
    with atheris.instrument_imports(include=["mlless", "fuzz_targets"]):
        import fuzz_targets
    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    seeds = fuzz_targets.valid_seeds(corpus / "data")[name] + list(fuzz_targets.findings()[name].values())
    for k, data in enumerate(seeds):
        (corpus / f"seed-{k}").write_bytes(data)
    target = fuzz_targets.TARGETS[name]
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(seconds)}", f"-timeout={timeout}",
                   f"-rss_limit_mb={rss_mb}", "-print_final_stats=1", f"-seed={seed}", f"-artifact_prefix={out}/{name}-"],
                  target)
    atheris.Fuzz()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="per target (default %(default)s)")
    p.add_argument("--targets", help="comma list (default: every target of tests/fuzz_targets.py)")
    p.add_argument("--timeout", type=int, default=5, help="seconds one input may take (default %(default)s)")
    p.add_argument("--rss-mb", type=int, default=2048, help="memory limit (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="libFuzzer's seed: 0 (the default) draws one; tests/test_fuzz.py fixes one, so it is repeatable")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1,
                   help="targets fuzzed at once (default: the CPUs, %(default)s)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "mlless-fuzz", help="findings' inputs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.seconds, args.timeout, args.rss_mb, args.seed, args.out)
        return 0
    sys.path.insert(0, str(TESTS))
    from fuzz_targets import TARGETS

    args.out.mkdir(parents=True, exist_ok=True)
    names = args.targets.split(",") if args.targets else sorted(TARGETS)

    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, __file__, "--child", name, "--seconds", str(args.seconds),
                               "--timeout", str(args.timeout), "--rss-mb", str(args.rss_mb), "--seed", str(args.seed),
                               "--out", str(args.out)], capture_output=True, text=True)

    # A child spends more time instrumenting mlless's imports than fuzzing for a second: they run side by side.
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = dict(zip(names, pool.map(run, names)))
    rows, failed = [], False
    for name, done in runs.items():
        stats = {k: int(v) for k, v in STATS.findall(done.stderr)}
        edges = re.findall(r"cov: (\d+)", done.stderr)
        finding = "none" if done.returncode == 0 else (re.findall(r"(crash|timeout|oom|leak)-\w+", done.stderr) or [
            f"exit {done.returncode}"])[0]
        failed |= done.returncode != 0
        rows.append((name, stats.get("number_of_executed_units", 0), stats.get("average_exec_per_sec", 0),
                     edges[-1] if edges else "?", finding))
        if done.returncode != 0:
            print(f"{name}:\n{done.stderr[-3000:]}", file=sys.stderr)
    print("| target | runs | exec/s | edges covered | finding |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

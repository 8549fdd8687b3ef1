#!/usr/bin/env python
"""What per-worker identity costs a step: the job-wide HMAC it replaced, Ed25519 per process, and per-pair MACs.

Issue #25 item 3 asked to choose between Ed25519 signatures and per-pair MAC keys by the measured cost per step.
Under all-to-all, at each step a worker seals its own update once and unseals each of its P - 1 peers' updates; the
supervisor unseals P reports and seals one close, and each worker seals one report and unseals one close. Timed
here, on random frames of 10 KB to 4 MB (the sizes of update frames: benchmarks/wire_cost.py), each a best-of:

- **hmac**: one key per job (the seal before per-worker identity): HMAC-SHA256 of context + frame, 16 bytes;
  anyone holding the job key may write as anyone.
- **ed25519**: `mlless.protocol.sealing` as it is: SHA-256 of context + frame, signed with the writer's own
  Ed25519 key; the badge (signer, public key, issuer's certificate) rides along, and each reader verifies the
  signature (a badge's certificate is checked once per process, then remembered).
- **per-pair**: one key per (writer, reader) pair: SHA-256 of context + frame once, then one 16-byte HMAC of the
  digest per reader; each reader hashes the frame and checks its own MAC.

A worker's sealing cost per step is seal + (P - 1) x unseal of its update frames (per-pair: the seal grows with P),
plus one report sealed and one close unsealed. Then a short real job (PMF on the MovieLens sample, BSP, embedded
broker) at P = 2 and 4, with this checkout (ed25519) and with `--baseline` (the HMAC library, default the commit
before per-worker identity), alternating, gives the wall time per step with and without.

    python benchmarks/identity.py [--steps 150] [--rounds 4] [--timing-rounds 5] [--baseline REV] [--no-jobs]
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_common.single_thread_env()

from mlless.protocol.identity import Issuer, Verifier  # noqa: E402
from mlless.protocol.sealing import SEAL_BYTES, Verified, seal, unseal  # noqa: E402

ROOT = _common.HERE.parent
SIZES = (10 << 10, 100 << 10, 1 << 20, 4 << 20)
WORKERS = (2, 4, 8)
CONTEXT = "value update:3:7"
CONTROL_BYTES = 120  # a Report frame is 26 header bytes and about 90 of payload; a Close, about 50 at P = 4
MAC_BYTES = 16


# --------------------------------------------------------------------------- the three schemes, sealing and unsealing

class JobMac:
    """The job-wide HMAC-SHA256 seal, as `mlless.protocol.sealing` made it before per-worker identity."""

    key = bytes(range(32))

    def _mac(self, frame: bytes | memoryview) -> bytes:
        h = hmac.new(self.key, CONTEXT.encode() + b"\0", "sha256")
        h.update(frame)
        return h.digest()[:MAC_BYTES]

    def seal(self, frame: bytes, readers: int) -> bytes:
        return frame + self._mac(frame)

    def unseal(self, sealed: bytes, readers: int = 1) -> bytes:
        view = memoryview(sealed)
        assert hmac.compare_digest(view[-MAC_BYTES:], self._mac(view[:-MAC_BYTES]))
        return Verified(view[:-MAC_BYTES], 0)  # the same copy into a `Verified` as the other two


class Signatures:
    """`mlless.protocol.sealing` as it is."""

    def __init__(self) -> None:
        issuer = Issuer()
        self.writer, self.verifier = issuer.issue(3), Verifier(issuer.public)

    def seal(self, frame: bytes, readers: int) -> bytes:
        return seal(frame, self.writer, CONTEXT)

    def unseal(self, sealed: bytes, readers: int = 1) -> bytes:
        opened = unseal(sealed, self.verifier, CONTEXT)
        assert opened
        return opened


class PairMacs:
    """One key per (writer, reader): the frame hashed once, then a MAC of the digest per reader; reader 0 checks."""

    keys = [bytes([q]) * 32 for q in range(max(WORKERS))]

    @staticmethod
    def _digest(frame: bytes | memoryview) -> bytes:
        h = hashlib.sha256(CONTEXT.encode() + b"\0")
        h.update(frame)
        return h.digest()

    def seal(self, frame: bytes, readers: int) -> bytes:
        digest = self._digest(frame)
        return b"".join([frame, *(hmac.digest(self.keys[q], digest, "sha256")[:MAC_BYTES] for q in range(readers))])

    def unseal(self, sealed: bytes, readers: int = 1) -> bytes:
        view = memoryview(sealed)
        frame = view[:-MAC_BYTES * readers]
        mac = hmac.digest(self.keys[0], self._digest(frame), "sha256")[:MAC_BYTES]
        assert hmac.compare_digest(view[len(frame):len(frame) + MAC_BYTES], mac)
        return Verified(frame, 0)


SCHEMES = {"hmac": JobMac(), "ed25519": Signatures(), "per-pair": PairMacs()}


def step_costs(rounds: int) -> tuple[list[list[object]], dict[tuple[str, int, int], float]]:
    """Rows of µs per operation, and a worker's sealing µs per step by (scheme, frame size, P). The schemes take
    turns, `rounds` times, and each timing is the fastest of all its rounds: a busy spell weighs on all alike."""
    control = os.urandom(CONTROL_BYTES)
    frames = {size: os.urandom(size) for size in SIZES}
    best: dict[tuple[str, str, int, int], float] = {}

    def keep(key: tuple[str, str, int, int], fn) -> None:
        best[key] = min(best.get(key, float("inf")), _common.best_us(fn, samples=3))

    for _ in range(rounds):
        for name, scheme in SCHEMES.items():
            small_sealed = scheme.seal(control, 1)
            keep((name, "seal", 0, 1), lambda: scheme.seal(control, 1))
            keep((name, "unseal", 0, 1), lambda: scheme.unseal(small_sealed, 1))
            for size, frame in frames.items():
                sealed = scheme.seal(frame, max(WORKERS) - 1)
                keep((name, "unseal", size, 1), lambda: scheme.unseal(sealed, max(WORKERS) - 1))
                for p in WORKERS:
                    keep((name, "seal", size, p), lambda: scheme.seal(frame, p - 1))
    ops, per_step = [], {}
    for name in SCHEMES:
        control_us = best[name, "seal", 0, 1] + best[name, "unseal", 0, 1]
        ops.append([name, "control frame", f"{CONTROL_BYTES} B", best[name, "seal", 0, 1], best[name, "unseal", 0, 1]])
        for size in SIZES:
            unsealed = best[name, "unseal", size, 1]
            ops.append([name, "update", f"{size >> 10:,} KB", best[name, "seal", size, max(WORKERS)], unsealed])
            for p in WORKERS:
                per_step[name, size, p] = best[name, "seal", size, p] + (p - 1) * unsealed + control_us
    return ops, per_step


# --------------------------------------------------------------------------- real jobs, with and without


def baseline_tree(rev: str, work: Path) -> Path:
    """`functions/` of commit `rev` in `work`, with this checkout's compiled kernels (the .pyx are unchanged)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "functions"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    for built in (ROOT / "functions").rglob("*.so"):
        shutil.copy2(built, work / built.relative_to(ROOT))
    return work / "functions"


def default_baseline() -> str:
    """The commit before `mlless/protocol/identity.py` was added."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--",
                            "functions/mlless/protocol/identity.py"], check=True, capture_output=True, text=True)
    return (added.stdout.split() or ["HEAD"])[-1] + "^"


def job_step(functions: Path, data: Path, workers: int, steps: int, run: Path) -> tuple[float, float]:
    """Wall seconds per step and read + apply ms per step of a short PMF job run with the library in `functions`."""
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    job = _common.write_pmf_job(run / "job.yaml", name="identity", workers=workers, data=data, protocol="bsp",
                                stop={"maxSteps": steps})
    env = {**os.environ, "PYTHONPATH": str(functions)}
    subprocess.run(_common.mlless_train_command(job, run / "out", False), check=True, env=env)
    summary = json.loads((run / "out" / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
    barrier = [(r["phases"]["read"] or 0) + (r["phases"]["apply"] or 0) for r in rows if r["phases"]["read"] is not None]
    return summary["wall_seconds"] / summary["steps"], 1e3 * sum(barrier) / max(1, len(barrier))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150, help="of each real job")
    parser.add_argument("--rounds", type=int, default=4, help="real jobs per library and P, alternating")
    parser.add_argument("--timing-rounds", type=int, default=5, help="turns the schemes take at the sealing timings")
    parser.add_argument("--baseline", default=None, help="the HMAC library's commit (default: before identity.py)")
    parser.add_argument("--no-jobs", action="store_true", help="only the sealing costs")
    args = parser.parse_args()
    load_before = _common.loadavg()
    ops, per_step = step_costs(args.timing_rounds)
    load_after = _common.loadavg()
    step_rows = []
    for size in SIZES:
        for p in WORKERS:
            base = per_step["hmac", size, p]
            step_rows.append([f"{size >> 10:,} KB", p, base / 1e3,
                              per_step["ed25519", size, p] / 1e3, (per_step["ed25519", size, p] - base) / 1e3,
                              per_step["per-pair", size, p] / 1e3, (per_step["per-pair", size, p] - base) / 1e3])
    jobs = []
    if not args.no_jobs:
        data = _common.prepare(_common.DEFAULT_DATA_DIR / "movielens-small", "--sample", "movielens-small")
        rev = args.baseline or default_baseline()
        with tempfile.TemporaryDirectory(prefix="mlless-identity-") as tmp:
            libraries = {"hmac": baseline_tree(rev, Path(tmp)), "ed25519": ROOT / "functions"}
            for p in (2, 4):
                got: dict[str, list[tuple[float, float]]] = {name: [] for name in libraries}
                for r in range(args.rounds):
                    for name, functions in libraries.items():
                        got[name].append(job_step(functions, data, p, args.steps,
                                                  _common.DEFAULT_DATA_DIR / "identity-runs" / f"{name}-{p}-{r}"))
                walls = {name: median(w for w, _ in runs) for name, runs in got.items()}
                barriers = {name: median(b for _, b in runs) for name, runs in got.items()}
                jobs.append([p, walls["hmac"] * 1e3, walls["ed25519"] * 1e3,
                             100 * (walls["ed25519"] / walls["hmac"] - 1), barriers["hmac"], barriers["ed25519"]])
        load_jobs = _common.loadavg()
    body = "\n".join([
        "## Per-worker identity: what sealing costs a step (issue #25 item 3)",
        "",
        f"`{_common.command_line()}`; {_common.machine_line()}. Load average {load_before} before the sealing "
        f"timings and {load_after} after" + (f", {load_jobs} after the jobs" if jobs else "") + ". The machine was "
        f"shared: each timing is the fastest of {args.timing_rounds} rounds in which the schemes took turns (the cost; "
        f"the rest is the load), the jobs' the median of {args.rounds} alternating runs.",
        "",
        f"Seal bytes per frame: hmac {MAC_BYTES}, ed25519 {SEAL_BYTES} (badge and signature), per-pair "
        f"{MAC_BYTES} x readers. µs per operation (per-pair's seal is for {max(WORKERS) - 1} readers):",
        "",
        _common.table(["scheme", "frame", "size", "seal µs", "unseal µs"], ops),
        "",
        "A worker's sealing ms per step under all-to-all: its update sealed once and P - 1 peers' unsealed, plus a "
        "report sealed and a close unsealed (composed from the timings above):",
        "",
        _common.table(["update", "P", "hmac ms", "ed25519 ms", "+ms", "per-pair ms", "+ms"], step_rows),
        *([
            "",
            f"Real jobs, PMF on the MovieLens sample, BSP, {args.steps} steps, embedded broker, all-to-all; hmac is "
            f"the library of `{args.baseline or default_baseline()}`, ed25519 this checkout's:",
            "",
            _common.table(["P", "hmac ms per step", "ed25519 ms per step", "+%", "hmac read + apply ms",
                           "ed25519 read + apply ms"], jobs),
        ] if jobs else []),
    ])
    _common.update_results("identity", body)
    print(body)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""What an update frame costs on the wire: bytes, encode, seal, store and fetch, unseal, decode; and the MAC.

Frame version 2 sends an update's indices as runs of consecutive indices when that is smaller
(`functions/mlless/protocol/index_runs.py`); version 1 listed every index.  Both are timed on the same updates, made by the
models' own AdaGrad steps on synthetic data shaped as `time_to_quality.py`'s sets:

- PMF on the 10M skewed ratings' shape (70,000 users, 10,000 items, Zipf 0.8): 200 ratings at rank 10, 20 and 50
  (a few hundred touched rows), and the default 6,250-rating batch at rank 20 (a BSP update);
- logistic regression on the clicks' shape (2^18 hashed features): 1,000 and 6,250 rows.

"old" is the protocol package of the commit before `runs.py` was added (`--baseline` to choose another), taken
from git history; "new" is this checkout's.  Each runs in its own process, the two alternating `--rounds` times; a
cell is the fastest of all its samples (the machine is shared: the fastest is the cost, the rest is the load).
encode is `encode(Update(...), sealed=True)` and decode is `decode` of the unsealed frame, as a worker calls them
(`runtime/worker.py`); seal and unseal are `mlless.protocol.sealing`'s; store + fetch is a Redis SET and a GET of
the sealed frame on loopback (left out when no Redis answers at `--redis`).

The MAC table times HMAC-SHA256 (what `sealing.py` used before each process sealed with its own Ed25519 identity:
benchmarks/identity.py) against keyed BLAKE2b and BLAKE2s from `hashlib`, over
the same context and frame, on 1 KB to 1 MB.

    python benchmarks/wire_cost.py [--rounds N] [--baseline REV] [--write-results]
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_common.single_thread_env()

import numpy as np  # noqa: E402

ROOT = _common.HERE.parent
KEY = bytes(range(32))
CONTEXT = "value update:3:7"
MAC_SIZES = (1 << 10, 16 << 10, 128 << 10, 1 << 20)
PHASES = ("encode", "seal", "store + fetch", "unseal", "decode")


# --------------------------------------------------------------------------- the updates


def _accumulator(model) -> np.ndarray:
    from mlless.training.optim import ADAGRAD_INITIAL

    return np.full(model.accumulator_size, ADAGRAD_INITIAL, np.float32)


def pmf_update(rank: int, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from mlless.data.batches import RatingsBatch
    from mlless.data.synthetic import PmfParams, generate_pmf
    from mlless.spec.config import ModelConfig
    from mlless.training.models.pmf import PMF

    params = PmfParams(rows=batch, users=70_000, items=10_000)
    chunk = next(generate_pmf(params, seed))
    model = PMF(params.users, params.items, params.mean, ModelConfig.of("pmf", rank=rank), seed)
    b = RatingsBatch(chunk.users.astype(np.int32), chunk.items.astype(np.int32), chunk.ratings)
    idx, delta, _, _ = model.adagrad_step(b, _accumulator(model), 0.1, 0.0)
    return idx, delta


def lr_update(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from mlless.data.batches import SparseBatch
    from mlless.data.synthetic import LrParams, generate_lr
    from mlless.training.models.logreg import LogisticRegression

    params = LrParams(rows=rows)
    chunk = next(generate_lr(params, seed))
    model = LogisticRegression(1 << params.hash_bits)
    b = SparseBatch(chunk.indptr, chunk.indices.astype(np.int32), chunk.values, chunk.labels)
    idx, delta, _, _ = model.adagrad_step(b, _accumulator(model), 0.1, 0.0)
    return idx, delta


def make_updates(path: Path) -> list[str]:
    cases = {f"PMF rank {r}, {n:,} ratings": pmf_update(r, n, 1) for r, n in ((10, 200), (20, 200), (50, 200), (20, 6250))}
    cases.update({f"LR, {n:,} rows": lr_update(n, 2) for n in (1000, 6250)})
    np.savez(path, **{f"{i}_idx": c[0] for i, c in enumerate(cases.values())},
             **{f"{i}_val": c[1] for i, c in enumerate(cases.values())})
    return list(cases)


# --------------------------------------------------------------------------- one protocol, in its own process


def measure(updates: Path, redis_url: str) -> dict[str, object]:
    """Per update: frame bytes and µs per phase, with the `mlless.protocol` this process imports (``from``)."""
    import mlless
    from mlless.protocol.framing import decode, encode
    from mlless.protocol.messages import Update
    from mlless.protocol import sealing
    from mlless.protocol.sealing import seal, unseal

    if hasattr(sealing, "SEAL_BYTES"):  # each process seals with its own identity (benchmarks/identity.py)
        from mlless.protocol.identity import Issuer, Verifier

        issuer = Issuer()
        writer, reader = issuer.issue(0), Verifier(issuer.public)
    else:  # a library from before: one HMAC key per job
        writer = reader = KEY

    try:
        import redis

        store = redis.Redis.from_url(redis_url)
        store.ping()
    except Exception:  # noqa: BLE001 - the store column is optional
        store = None
    data = np.load(updates)
    out = []
    for i in range(len(data.files) // 2):
        idx, val = data[f"{i}_idx"], data[f"{i}_val"]
        frame = encode(Update(0, 7, idx, val), sealed=True)
        sealed = seal(frame, writer, CONTEXT)
        opened = unseal(sealed, reader, CONTEXT)
        assert decode(opened) == Update(0, 7, idx, val)
        row = {
            "entries": float(idx.size),
            "bytes": float(len(frame)),
            "encode": _common.best_us(lambda: encode(Update(0, 7, idx, val), sealed=True)),
            "seal": _common.best_us(lambda: seal(frame, writer, CONTEXT)),
            "unseal": _common.best_us(lambda: unseal(sealed, reader, CONTEXT)),
            "decode": _common.best_us(lambda: decode(opened)),
        }
        if store is not None:
            name = f"mlless-wire-cost:{os.getpid()}"
            row["store + fetch"] = _common.best_us(lambda: (store.set(name, sealed), store.get(name)))
            store.delete(name)
        out.append(row)
    return {"from": mlless.__file__, "rows": out}


def baseline_tree(rev: str, work: Path) -> Path:
    """The `functions/` tree of commit `rev`, extracted into `work`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "functions/mlless"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    return work / "functions"


def default_baseline() -> str:
    """The commit before `runs.py` (frame version 2) was added."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--",
                            "functions/mlless/protocol/index_runs.py"], check=True, capture_output=True, text=True)
    return added.stdout.split()[-1] + "^"


def run_child(functions: Path, updates: Path, redis_url: str) -> list[dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(functions)}
    proc = subprocess.run([sys.executable, __file__, "--measure", str(updates), "--redis", redis_url], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"measuring with {functions} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    if not Path(out["from"]).resolve().is_relative_to(functions.resolve()):
        raise SystemExit(f"the child imported mlless from {out['from']}, not from {functions}")
    return out["rows"]


# --------------------------------------------------------------------------- the MAC


def mac_table() -> list[list[object]]:
    ctx = CONTEXT.encode() + b"\0"

    def hmac_sha256(frame: bytes) -> bytes:
        h = hmac.new(KEY, ctx, "sha256")
        h.update(frame)
        return h.digest()[:16]

    def blake2b(frame: bytes) -> bytes:
        h = hashlib.blake2b(ctx, key=KEY, digest_size=16)
        h.update(frame)
        return h.digest()

    def blake2s(frame: bytes) -> bytes:
        h = hashlib.blake2s(ctx, key=KEY, digest_size=16)
        h.update(frame)
        return h.digest()

    rows = []
    for size in MAC_SIZES:
        frame = os.urandom(size)
        times = [_common.best_us(lambda f=f: f(frame), samples=15) for f in (hmac_sha256, blake2b, blake2s)]
        mb = size / (1 << 20)
        rows.append([f"{size >> 10:,} KB", *times, *(t / 1000 / mb for t in times)])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="old/new process pairs, alternating")
    ap.add_argument("--baseline", help="the commit whose protocol is 'old' (default: the one before runs.py)")
    ap.add_argument("--redis", default=_common.REDIS)
    ap.add_argument("--write-results", action="store_true", help="replace this script's section of RESULTS.md")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # a child: time this process's protocol
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.redis)))
        return

    info = _common.machine_info()
    baseline = args.baseline or default_baseline()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        names = make_updates(work / "updates.npz")
        trees = {"old": baseline_tree(baseline, work), "new": ROOT / "functions"}
        runs: dict[str, list[list[dict[str, float]]]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                runs[label].append(run_child(tree, work / "updates.npz", args.redis))
    best = {label: [{k: min(r[i][k] for r in rs) for k in rs[0][i]} for i in range(len(names))]
            for label, rs in runs.items()}
    phases = [p for p in PHASES if p in best["new"][0]]
    rows = []
    for i, name in enumerate(names):
        for label in ("old", "new"):
            r = best[label][i]
            rows.append([name if label == "old" else "", label, int(r["entries"]), int(r["bytes"]),
                         *(r[p] for p in phases), sum(r[p] for p in phases)])
    updates = _common.table(["update", "frame", "entries", "bytes", *(f"{p} µs" for p in phases), "total µs"], rows)
    macs = _common.table(["frame", "HMAC-SHA256 µs", "BLAKE2b µs", "BLAKE2s µs", "HMAC ms/MB", "BLAKE2b ms/MB",
                          "BLAKE2s ms/MB"], mac_table())
    load_end = _common.loadavg()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    body = (f"Run: `{_common.command_line()}`; {_common.machine_line(info)}; load average at the end {load_end}.\n"
            f"old = frame version 1 at `{baseline}`, new = commit `{commit}`; fastest of {args.rounds} alternating "
            f"process pairs x 7 samples.\n\n{updates}\n\nMAC of one frame (16-byte tag, fastest of 15 samples):\n\n"
            f"{macs}\n")
    print(body)
    if args.write_results:
        _common.update_results("wire_cost", body)


if __name__ == "__main__":
    main()

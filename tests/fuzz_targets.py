"""The fuzz targets of tests/test_fuzz.py (hypothesis) and benchmarks/fuzz.py (atheris): each feeds bytes to one
parser of untrusted input and returns normally if it parsed them or raised its one error type; anything else
escapes, and is a finding."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from mlless.data.batches import BATCH_TYPES, BatchError
from mlless.data.csvfile import CsvError, CsvOptions, csv_layout, read_csv
from mlless.data.formats import LibsvmOptions, read_criteo, read_libsvm, read_movielens
from mlless.data.manifest import DatasetError, Manifest
from mlless.data.npz import load_npz_bytes
from mlless.data.text import ErrorLog, MalformedInputError
from mlless.protocol.framing import HEADER, FrameError, decode
from mlless.protocol.identity import Issuer, Verifier
from mlless.protocol.sealing import Verified, unseal
from mlless.runtime.function_server import InvocationError, Invocation
from mlless.spec import SpecError
from mlless.spec.job import load_manifest

JOB_ID = "fuzz-0123456789"
#: Inputs the coverage-guided harness once found escaping a target, one directory per target: kept as regression
#: tests (tests/test_fuzz.py) and as seeds of the harness's corpus (benchmarks/fuzz.py).
FINDINGS = Path(__file__).resolve().parent / "fuzz_findings"
#: The issuer of the identities the sealed-message target's seeds are sealed with (the fuzzer never sees its key).
ISSUER = Issuer()
VERIFIER = Verifier(ISSUER.public)
#: The context control messages are sealed under (`transport/base.py` MESSAGE_CONTEXT).
CONTEXT = "message"


def _in_file(data: bytes, suffix: str, parse: Callable[[str], object]) -> None:
    fd, path = tempfile.mkstemp(suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        parse(path)
    finally:
        os.unlink(path)


def manifest(data: bytes) -> None:
    try:
        _in_file(data, ".yaml", load_manifest)
    except SpecError:
        pass


def invocation(data: bytes) -> None:
    try:
        Invocation.parse(data, JOB_ID)
    except InvocationError:
        pass


def dataset_manifest(data: bytes) -> None:
    try:
        Manifest.from_json(data, "manifest.json")
    except DatasetError:
        pass


def batch(data: bytes) -> None:
    """A batch file as the dataset reads it (its checksum matched): npz, then the batch's own checks."""
    try:
        arrays = load_npz_bytes(data, "batch.npz")
    except ValueError:
        return
    for kind in BATCH_TYPES:
        try:
            BATCH_TYPES[kind].from_arrays(arrays, "batch.npz")
        except BatchError:
            pass


def frame(data: bytes) -> None:
    """Any frame, every control message and update among them: as it comes from the embedded broker (with its
    checksum), and as one whose seal verified as its sender's (without it), which reaches every field's checks."""
    sender = HEADER.unpack_from(data)[4] if len(data) >= HEADER.size else 0
    for given in (data, Verified(data, sender)):
        try:
            decode(given)
        except FrameError:
            pass


def sealed(data: bytes) -> None:
    """A message as a worker or the supervisor receives it: unsealed against the job's issuer, then decoded."""
    try:
        decode(unseal(data, VERIFIER, CONTEXT))
    except FrameError:
        pass


def _lines(read: Callable[..., object], suffix: str) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        for policy in ("fail", "skip"):
            try:
                _in_file(data, suffix, lambda path: list(read(path, ErrorLog(policy))))
            except MalformedInputError:
                assert policy == "fail"
    return target


def _read_csv(path: str, errors: ErrorLog) -> list:
    """A CSV file as `mlless prepare --format csv --label y` reads it: its header and first rows, then every row."""
    options = CsvOptions("y", hash_bits=8)
    try:
        layout = csv_layout(path, options)
    except CsvError:
        return []
    return list(read_csv(path, errors, options, layout))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "manifest": manifest,
    "invocation": invocation,
    "dataset-manifest": dataset_manifest,
    "batch": batch,
    "frame": frame,
    "sealed": sealed,
    "movielens": _lines(read_movielens, ".csv"),
    "criteo": _lines(lambda path, errors: read_criteo(path, errors, hash_bits=12), ".tsv"),
    "libsvm": _lines(lambda path, errors: read_libsvm(path, errors, LibsvmOptions()), ".svm"),
    "csv": _lines(_read_csv, ".csv"),
}


def valid_seeds(tmp: Path) -> dict[str, list[bytes]]:
    """A few valid inputs for each target, which mutations start from."""
    from mlless.data.prepare import PrepareOptions, prepare
    from mlless.data.sources import synthetic_lr_source, synthetic_pmf_source
    from mlless.data.synthetic import LrParams, PmfParams
    from mlless.protocol.framing import encode
    from mlless.protocol.messages import (
        CLOSE_SNAPSHOT, Close, Done, Failed, Finish, Hello, Leave, Left, Report, Takeover, Tensors, Update,
    )
    from mlless.protocol.sealing import seal
    from mlless.spec import from_manifest

    options = PrepareOptions(batch_size=50, validation_fraction=0.2, progress=False)
    prepare(synthetic_pmf_source(PmfParams(rows=120, users=12, items=9, rank=2), 0), str(tmp / "ratings"), options)
    prepare(synthetic_lr_source(LrParams(rows=120, hash_bits=6), 0), str(tmp / "sparse"), options)
    job = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "fuzz"},
           "spec": {"workers": 2, "model": {"type": "pmf"}, "dataset": {"uri": str(tmp / "ratings")},
                    "stop": {"maxSteps": 10}, "sync": {"protocol": "blocked", "localSteps": 4}}}
    resolved = json.loads(from_manifest(job).to_json())
    messages = [Hello(0, 0, 7), Report(1, 3, 2.5, 40, True, 100, 10, 5, (0.1,) * 7, 64),
                Close(-1, 3, 12, CLOSE_SNAPSHOT, (0, 1), (1,), ()), Leave(-1, 3, 1), Left(1, 3, True), Finish(-1, 4),
                Takeover(-1, 4), Done(0, 4, 1.5, 10, 20), Failed(1, 2, "no data"),
                Update(0, 3, np.array([1, 2, 5], np.int32), np.array([0.5, -1.0, 2.0], np.float32)),
                Tensors(0, 3, {"params": np.zeros(4, np.float32)})]
    criteo = "1\t" + "\t".join(str(k) for k in range(13)) + "\t" + "\t".join(f"{k:08x}" for k in range(26))
    return {
        "manifest": [yaml.safe_dump(job).encode(), json.dumps(job).encode()],
        "invocation": [json.dumps({"rank": 1, "jobId": JOB_ID, "job": resolved, "resume": False,
                                   "deadlineSeconds": 30}).encode()],
        "dataset-manifest": [(tmp / kind / "manifest.json").read_bytes() for kind in ("ratings", "sparse")],
        "batch": [(tmp / kind / "train" / "batch-000000.npz").read_bytes() for kind in ("ratings", "sparse")],
        "movielens": [b"userId,movieId,rating,timestamp\n1,10,4.0,964982703\n2,11,3.5,964982224\n",
                      b"1::10::4::978300760\n2::11::5::978302109\n"],
        "criteo": [(criteo + "\n" + criteo.replace("1\t", "0\t", 1) + "\n").encode()],
        "libsvm": [b"1 1:0.5 7:1\n0 2:1.5 3:-2\n", b"-1 4:1\n+1 1:1 2:2\n"],
        "csv": [b"a,b,y\n1.5,x,1\n2,,0\n", b'y,c,n\n-1,"q,r",3e2\n1,s,\n'],
        "frame": [encode(m) for m in messages] + [encode(m, sealed=True) for m in messages],
        "sealed": [seal(encode(m, sealed=True), ISSUER.issue(m.sender), CONTEXT) for m in messages],
    }


def findings() -> dict[str, dict[str, bytes]]:
    """The inputs under FINDINGS, by target and file name."""
    return {name: {path.name: path.read_bytes() for path in sorted((FINDINGS / name).glob("*"))} for name in TARGETS}

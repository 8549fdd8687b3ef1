"""spec.sync.precision (protocol/precision.py): update and gradient values travel in float16 or bfloat16 at half the
bytes, frames say their precision and decode strictly, and every replica applies the same rounded values."""
from __future__ import annotations

import types
import zlib

import numpy as np
import pytest

from mlless.protocol.framing import HEADER, PRECISION_SHIFT, FrameError, decode, encode
from mlless.protocol.messages import Hello, Update
from mlless.protocol.precision import BY_NAME, precision
from mlless.runtime.local import Services, train_local
from mlless.spec import SpecError
from mlless.spec.crd import crd_manifest
from mlless.spec.schema import choices, pairing_errors
from mlless.sync.base import WorkerHalf
from mlless.sync.exchanges.alltoall import AllToAll
from mlless.training.replica import TrainingDiverged

from test_training import QUIET, job_for

DENSE = np.arange(1000, dtype=np.int32)


def values(n: int = 1000, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 10.0 ** np.random.default_rng(seed + 1).integers(
        -6, 3, n)).astype(np.float32)


def reframed(frame: bytes, flags: int | None = None, payload: bytes | None = None) -> bytes:
    """`frame` with other header flags or another payload, its length and checksum made to match."""
    magic, version, ftype, old, sender, step, _, _ = HEADER.unpack_from(frame)
    body = frame[HEADER.size:] if payload is None else payload
    return HEADER.pack(magic, version, ftype, old if flags is None else flags, sender, step, len(body),
                       zlib.crc32(body)) + body


def test_the_codecs_are_the_schemas_names_and_round_as_torch_and_numpy_do():
    assert tuple(BY_NAME) == choices("sync.precision")
    x = values(100000)
    np.testing.assert_array_equal(precision("float16").rounded(x), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(precision("float32").rounded(x), x)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(precision("bfloat16").rounded(x),
                                  torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    for name in BY_NAME:  # what a frame carries it carries again
        once = precision(name).rounded(x)
        np.testing.assert_array_equal(precision(name).rounded(once), once)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_half_precision_frame_carries_its_values_in_half_the_bytes_and_decodes_as_it_was_made(name):
    wide, narrow = Update(0, 3, DENSE, values()), Update(0, 3, DENSE, values(), name)
    assert len(encode(wide)) - len(encode(narrow)) == 2 * len(DENSE)  # 2 bytes a value instead of 4
    out = decode(encode(narrow))
    assert out == narrow and out.precision == name and out.values.dtype == np.float32
    np.testing.assert_array_equal(out.values, precision(name).rounded(values()))


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_frame_of_the_wrong_precision_or_length_is_refused_in_one_line():
    wide = encode(Update(1, 3, DENSE, values()))
    half = encode(Update(1, 3, DENSE, values(), "float16"))
    code16 = BY_NAME["float16"].code << PRECISION_SHIFT
    # a header saying float16 over float32 values, and float32 over float16 ones: the lengths do not add up
    with pytest.raises(FrameError, match=r"holds \d+ bytes after its counts, expected") as exc:
        decode(reframed(wide, flags=code16))
    one_line(exc)
    with pytest.raises(FrameError, match="expected"):
        decode(reframed(half, flags=0))
    with pytest.raises(FrameError, match="expected"):  # a value short
        decode(reframed(half, payload=half[HEADER.size:-2]))
    with pytest.raises(FrameError, match="unknown precision code 3"):
        decode(reframed(half, flags=3 << PRECISION_SHIFT))
    with pytest.raises(FrameError, match="HELLO carries float32 values only"):
        decode(reframed(encode(Hello(1, 2, 3)), flags=code16))
    inf = half[:-2] + np.array([np.inf], np.float16).tobytes()  # what float16 overflows to
    with pytest.raises(FrameError, match="NaN or inf"):
        decode(reframed(inf))


def test_float16_refuses_a_value_beyond_its_range_rather_than_clip_it():
    big = np.array([1.0, -70000.0], np.float32)
    with pytest.raises(FrameError, match="values reach -70000, beyond float16's largest 65504") as exc:
        Update(0, 1, np.arange(2), big, "float16")
    one_line(exc)
    assert Update(0, 1, np.arange(2), big, "bfloat16").values[1] == -70144.0  # bfloat16 holds it, rounded
    # a worker about to publish it stops, saying what to change
    half = types.SimpleNamespace(precision=precision("float16"))
    with pytest.raises(TrainingDiverged, match=r"^the shared values reach -70000, beyond float16's largest 65504 "
                                               r"\(spec.sync.precision\): lower spec.optimizer.learningRate, or set "
                                               r"spec.sync.precision bfloat16$"):
        WorkerHalf.wire(half, big)  # type: ignore[arg-type]


def test_an_exchange_rejects_a_frame_in_another_precision_than_the_jobs():
    rejected: list[str] = []
    transport = types.SimpleNamespace(store_epoch=0)
    exchange = AllToAll(transport, 0, lambda rank, step: f"u:{rank}:{step}", 1, 0.0, rejected.append,  # type: ignore[arg-type]
                        size=1000, precision="bfloat16")
    assert exchange.checked(1, 3, encode(Update(1, 3, DENSE, values(), "bfloat16"))) is not None
    assert exchange.checked(1, 3, encode(Update(1, 3, DENSE, values(), "float16"))) is None
    assert rejected == ["update frame of worker 1 for step 3: its values travel in float16, expected bfloat16"]


def test_in_store_which_sums_float32_in_redis_is_refused_with_a_narrow_precision(movielens_dir):
    [line] = pairing_errors({"model": {"type": "pmf"}, "sync": {"precision": "float16", "exchange": "in-store"}})
    assert line == ("spec.sync.precision: float16 cannot run with spec.sync.exchange in-store, whose merge in Redis "
                    "reads float32 frames only")
    assert not list(pairing_errors({"model": {"type": "pmf"}, "sync": {"precision": "bfloat16",
                                                                        "exchange": "allreduce"}}))
    with pytest.raises(SpecError, match="spec.sync.precision: bfloat16 cannot run with spec.sync.exchange in-store"):
        job_for(movielens_dir, sync={"precision": "bfloat16", "exchange": "in-store"})
    rules = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]  # the API server's copy of the check
    [rule] = [r["rule"] for r in rules if r["message"].startswith("spec.sync.precision")]
    assert "self.sync.precision == 'float32'" in rule and "['in-store']" in rule


def net_job(digits_dir, **sync):
    return job_for(digits_dir, workers=2, model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]},
                   sync=sync, stop={"maxSteps": 30})


@pytest.mark.slow
def test_gradient_averaging_in_half_precision_keeps_replicas_equal_at_half_the_bytes(digits_dir, tmp_path, redis_url,
                                                                                    amqp_url, audit):
    from test_gradients import assert_conserved_steps

    services = Services(redis_url, amqp_url)
    runs = {(name, exchange): train_local(net_job(digits_dir, precision=name, exchange=exchange),
                                          tmp_path / f"{name}-{exchange}", services, QUIET)
            for name, exchange in [("float32", "all-to-all"), ("float16", "all-to-all"), ("bfloat16", "all-to-all"),
                                   ("float16", "allreduce"), ("bfloat16", "scatter-reduce")]}
    for (name, exchange), summary in runs.items():
        assert summary["steps"] == 30 and summary["rejected_frames"] == 0, (name, exchange)
        # every worker adds its own gradient as its peers read it: a worker using its unrounded gradient would
        # step its Adam by another mean than its peers', and the replicas would drift apart
        assert summary["replica_spread"] < 1e-6, (name, exchange, summary["replica_spread"])
        assert_conserved_steps(summary)
        assert summary["validation_scores"]["accuracy"] > 0.5, (name, exchange, summary["validation_scores"])
    assert runs["float16", "all-to-all"]["replica_spread"] == runs["bfloat16", "all-to-all"]["replica_spread"] == 0
    wide = runs["float32", "all-to-all"]["bytes_sent"]
    for name in ("float16", "bfloat16"):
        assert 0.45 * wide < runs[name, "all-to-all"]["bytes_sent"] < 0.55 * wide, (name, wide)


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["all-to-all", "allreduce"])
def test_what_rounding_leaves_out_of_an_update_stays_pending_on_its_sender(movielens_dir, tmp_path, redis_url, amqp_url,
                                                                          audit, exchange):
    from test_scaling import assert_conserved

    job = job_for(movielens_dir, sync={"protocol": "isp", "precision": "float16", "exchange": exchange},
                  stop={"maxSteps": 40})
    summary = train_local(job, tmp_path, Services(redis_url, amqp_url), QUIET)
    assert summary["steps"] == 40 and summary["rejected_frames"] == 0
    assert_conserved(summary)  # lost residuals would leave the shared state off by them

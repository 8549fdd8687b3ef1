"""In-store aggregation (spec.sync.exchange: in-store, sync/exchanges/instore.py): the script in real Redis adds a
step's updates with their carriers, every worker reads one frame, a forged contribution or merged record is
rejected and counted, a Redis that lost everything (keys and script) is repaired, and a job trains as all-to-all."""
from __future__ import annotations

import threading
import uuid
import zlib
from contextlib import ExitStack

import numpy as np
import pytest
import redis

from mlless.protocol.framing import FLAG_SEALED, HEADER, MAGIC, VERSION, FrameError, FrameType, decode, encode
from mlless.protocol.messages import Close, Update
from mlless.protocol.index_runs import COUNTS
from mlless.runtime.local import Services, train_local
from mlless.sync.exchanges.instore import InStore
from mlless.spec import SpecError
from mlless.transport import connect
from mlless.transport.base import key_prefix

from faults.conftest import redis_server
from test_scaling import assert_conserved
from test_training import QUIET, job_for

SIZE, N, STEP = 60, 3, 7
KEY_OF = lambda rank, step: f"update:{rank}:{step % 3}"  # noqa: E731


@pytest.fixture
def job(redis_url, amqp_url):
    """A job id of this test's own and its workers' transports on the shared services; its keys are deleted after."""
    job_id = f"instore-{uuid.uuid4().hex[:10]}"
    with ExitStack() as stack:
        transports = [connect(job_id, redis_url=redis_url, amqp_url=amqp_url, role="worker", rank=r) for r in range(N)]
        for t in transports:
            stack.callback(t.close)
        stack.callback(transports[0].delete_job)
        yield job_id, transports


def workers(transports, rejected, carriers=True, size=SIZE):
    return [InStore(t, t.rank, KEY_OF, 3, 2.0, rejected.append, size=size, parts=N, carriers=carriers)
            for t in transports]


def publish(exchanges, touched=20, seed=1):
    rng = np.random.default_rng(seed)
    sent = [np.sort(rng.choice(w.size, touched, replace=False)).astype(np.int32) for w in exchanges]
    values = [rng.standard_normal(touched).astype(np.float32) for _ in exchanges]
    for w, idx, val in zip(exchanges, sent, values):
        w.publish(STEP, idx, val)
    return sent, values


def added(updates, size=SIZE):
    dense, carriers = np.zeros(size), np.zeros(size, int)
    for u in updates:
        np.add.at(dense, u.indices, u.values)
        np.add.at(carriers, u.indices, 1)
    return dense, carriers


def expected(sent, values, peers, size=SIZE):
    want, carriers = np.zeros(size), np.zeros(size, int)
    for r in peers:
        np.add.at(want, sent[r], values[r].astype(np.float64))
        np.add.at(carriers, sent[r], 1)
    return want, carriers


CLOSE = Close(-1, STEP, 0, 0, live=(0, 1, 2), updates=(0, 1, 2), merges=())


@pytest.mark.services
@pytest.mark.parametrize("touched, size", [(20, SIZE), (SIZE, SIZE), (20, 100_000)])
def test_the_store_adds_the_step_and_each_worker_reads_one_frame(job, touched, size):
    # 20 of 60: most entries carried by one update; 60 of 60: by every update; 20 of 100,000: the union is too
    # sparse for the script to add it over its range, it adds in a hash and sorts
    _, transports = job
    rejected = []
    exchanges = workers(transports, rejected, size=size)
    sent, values = publish(exchanges, touched)
    for w in exchanges:
        dense, carriers = added(w.gather(CLOSE), size)
        want, want_carriers = expected(sent, values, [r for r in range(N) if r != w.rank], size)
        np.testing.assert_allclose(dense, want, atol=1e-5)
        assert np.array_equal(carriers, want_carriers)  # what AveragingHalf.combine divides by
        merged, read = w.traffic()
        # one merged record: the frame of the union, a 20-byte MAC and its short text head, no peer frame
        assert merged == 0 and read < len(encode(Update(0, STEP, np.arange(SIZE), np.zeros(SIZE)))) * 2 + 60
    assert rejected == []


@pytest.fixture
def step(job):
    """The job's id, its workers' exchanges once each has published its update of STEP, those updates and the
    list of what the workers rejected."""
    job_id, transports = job
    rejected: list[str] = []
    exchanges = workers(transports, rejected, carriers=False)
    return job_id, exchanges, *publish(exchanges), rejected


@pytest.mark.services
def test_a_forged_contribution_is_left_out_and_counted_by_every_reader(step, redis_url):
    job_id, exchanges, sent, values, rejected = step
    # Someone who can write to Redis but has no job key replaces worker 1's update: right sender and step, MAC made
    # with a key of its own, the transport's seal faked.
    forged = encode(Update(1, STEP, np.arange(5), np.full(5, 1000.0)), sealed=True)
    slot = key_prefix(job_id) + exchanges[1].part_key(1, 0, STEP)
    redis.Redis.from_url(redis_url).set(slot, forged + b"m" * 20 + b"s" * 16, ex=60)
    for w in exchanges:
        dense, _ = added(w.gather(CLOSE))
        want, _ = expected(sent, values, [r for r in (0, 2) if r != w.rank])
        np.testing.assert_allclose(dense, want, atol=1e-5)  # nobody applies the forgery
    assert len(rejected) == N and all("worker 1 for step 7" in r and "in-store MAC" in r for r in rejected)


def member_frame(payload: bytes, flags: int = FLAG_SEALED) -> bytes:
    """An update of worker 1 for this step with `payload`, its CRC right: what a member gone wrong could seal."""
    return HEADER.pack(MAGIC, VERSION, FrameType.UPDATE, flags, 1, STEP, len(payload), zlib.crc32(payload)) + payload


def values_of(n: int) -> bytes:
    return np.zeros(n, "<f4").tobytes()


def runs(n: int, starts: list[int], lengths: list[int]) -> bytes:
    return COUNTS.pack(n, len(starts)) + np.array(starts, "<i4").tobytes() + np.array(lengths, "<u4").tobytes()


MEMBER_PAYLOADS = {
    # Values of 1e30 are finite in float32: `MAX_MAGNITUDE` leaves them out of what `decode` accepts.
    "beyond the value bound": encode(Update(1, STEP, np.arange(5), np.zeros(5, np.float32)))[HEADER.size:][:-20]
                              + np.full(5, 1e30, "<f4").tobytes(),
    # Index encodings `protocol/index_runs.py` never writes, and `read_indices` refuses.
    "an empty run": runs(6, [0, 10], [6, 0]) + values_of(6),
    "a run that continues the one before": runs(6, [0, 3], [3, 3]) + values_of(6),
    "runs where listing takes less": runs(4, [0, 10], [2, 2]) + values_of(4),
    "a listing of one run": COUNTS.pack(6, 0) + np.arange(6, dtype="<i4").tobytes() + values_of(6),
}


@pytest.mark.services
@pytest.mark.parametrize("payload", MEMBER_PAYLOADS.values(), ids=MEMBER_PAYLOADS.keys())
def test_a_members_contribution_that_decode_refuses_is_left_out(step, payload):
    """A member gone wrong (the right step key and seal) writes an update `decode` refuses: the script leaves it out,
    as `decode` would, instead of adding it into a merged frame every reader would refuse or take."""
    _, exchanges, sent, values, rejected = step
    with pytest.raises(FrameError):  # the same payload, checked by its CRC rather than a seal
        decode(member_frame(payload, flags=0), size=SIZE)
    exchanges[1].transport.put(exchanges[1].part_key(1, 0, STEP), exchanges[1].stored(STEP, member_frame(payload)))
    for w in exchanges:
        dense, _ = added(w.gather(CLOSE))
        want, _ = expected(sent, values, [r for r in (0, 2) if r != w.rank])
        np.testing.assert_allclose(dense, want, atol=1e-5)
    assert len(rejected) == N and all("worker 1 for step 7" in r for r in rejected)


@pytest.mark.services
def test_a_changed_merged_record_is_rejected_and_the_reader_merges_the_step_itself(step, redis_url):
    job_id, exchanges, sent, values, rejected = step
    exchanges[0].gather(CLOSE)  # the store merges the step and keeps the record
    r = redis.Redis.from_url(redis_url)
    merged = key_prefix(job_id) + exchanges[0].reduced_key(0, STEP)
    record = bytearray(r.get(merged))
    record[-1] ^= 1  # the last value's low bit
    r.set(merged, bytes(record), ex=60)
    dense, _ = added(exchanges[1].gather(CLOSE))
    np.testing.assert_allclose(dense, expected(sent, values, [0, 2])[0], atol=1e-5)
    assert len(rejected) == 1 and "bad in-store MAC" in rejected[0]


@pytest.mark.services
def test_a_redis_that_lost_its_keys_and_script_is_repaired_by_re_publication(amqp_url):
    """What a restart without persistence leaves (no key, no script) in a Redis of the test's own: each worker's
    transport notices, re-publishes its frames, and the readers merge the step from them."""
    with redis_server() as port:
        url = f"redis://127.0.0.1:{port}/0"
        job_id = f"instore-{uuid.uuid4().hex[:10]}"
        transports = [connect(job_id, redis_url=url, amqp_url=amqp_url, role="worker", rank=r) for r in range(N)]
        try:
            rejected = []
            exchanges = workers(transports, rejected, carriers=False)
            sent, values = publish(exchanges)
            private = redis.Redis.from_url(url)
            private.flushall()
            private.script_flush()
            got: dict[int, np.ndarray] = {}
            threads = [threading.Thread(target=lambda w=w: got.__setitem__(w.rank, added(w.gather(CLOSE))[0]))
                       for w in exchanges]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            for w in exchanges:
                np.testing.assert_allclose(got[w.rank], expected(sent, values, [r for r in range(N) if r != w.rank])[0],
                                           atol=1e-5)
                assert w.transport.store_epoch == 1
            assert rejected == [] and sum(w.repaired for w in exchanges) > 0
            # The next step goes through the script again, loaded anew.
            publish(exchanges, seed=2)
            assert all(w.merged(STEP, [0, 1, 2])[0] is not None for w in exchanges)
        finally:
            transports[0].delete_job()
            for t in transports:
                t.close()


def test_in_store_needs_one_redis_and_the_sum(movielens_dir, tmp_path, redis_url, amqp_url):
    job = job_for(movielens_dir, sync={"exchange": "in-store"}, stop={"maxSteps": 5})
    with pytest.raises(SpecError, match="spec.sync.exchange: in-store runs a script in Redis"):
        train_local(job, tmp_path, Services(), QUIET)
    with pytest.raises(SpecError, match="spec.sync.exchange: in-store runs a script in one Redis, and the job's "
                                        "Redis is 2 shards"):
        train_local(job, tmp_path, Services(f"{redis_url} {redis_url}", amqp_url), QUIET)
    with pytest.raises(SpecError, match="spec.sync.exchange: in-store runs a script in one Redis, and "
                                        "spec.redis.shards is 2"):
        job_for(movielens_dir, sync={"exchange": "in-store"}, redis={"shards": 2})
    with pytest.raises(SpecError, match="spec.sync.aggregation: median cannot run with spec.sync.exchange in-store"):
        job_for(movielens_dir, workers=3, sync={"exchange": "in-store", "aggregation": "median"})


@pytest.mark.slow
@pytest.mark.services
def test_a_job_trains_in_store_as_it_does_all_to_all(movielens_dir, tmp_path, redis_url, amqp_url, monkeypatch):
    monkeypatch.setenv("MLLESS_AUDIT", "1")
    svc = Services(redis_url, amqp_url)
    summaries = {}
    for exchange in ("all-to-all", "in-store"):
        job = job_for(movielens_dir, workers=3, sync={"protocol": "bsp", "exchange": exchange}, stop={"maxSteps": 40})
        summaries[exchange] = train_local(job, tmp_path / exchange, svc, QUIET)
    got, want = summaries["in-store"], summaries["all-to-all"]
    assert got["steps"] == 40 and got["rejected_frames"] == 0 and got["replica_spread"] < 1e-4
    assert_conserved(got)
    assert got["validation_loss"] == pytest.approx(want["validation_loss"], abs=2e-3)

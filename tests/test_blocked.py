"""Blocked matrix factorisation (spec.sync.protocol: blocked, sync/protocols/blocked.py): the strata of a round share
no user and no item and partition the ratings evenly, PMF trains on both transports, and the protocol is refused for
a model without users and items. Scale-in, the auto-tuner and a killed supervisor under blocked are tested with
averaging's, in tests/test_averaging.py."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.contract import STOP_MAX_EPOCHS
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local
from mlless.sync import sync_strategy
import json
import shutil

from mlless.data.user_shards import MAX_BLOCKS, USER_SHARDS, deal, shard_of
from mlless.data.strata import BlockedFeed, ByUserShard, EveryBatch
from mlless.spec import SpecError, SyncConfig, from_manifest
from mlless.spec.crd import crd_manifest

from test_training import QUIET, job_for, manifest, read_metrics


@pytest.mark.parametrize("workers", [2, 3])
def test_the_strata_partition_the_ratings_evenly_and_a_rounds_share_no_row(movielens_dir, workers):
    dataset = Dataset.open(str(movielens_dir), cache_batches=True)
    live = tuple(range(workers))
    feeds = [BlockedFeed(dataset, seed=7, local_steps=16) for _ in live]
    for round_ in range(workers):
        for local in range(1, 17):
            batches = [feed.take(0, round_ * 16 + local, live, rank) for rank, feed in zip(live, feeds)]
            for a in range(workers):
                for b in range(a + 1, workers):
                    assert not set(batches[a].users) & set(batches[b].users)
                    assert not set(batches[a].items) & set(batches[b].items)
    strata = [stratum for feed in feeds for stratum in feed.strata]
    every = sorted((int(u), int(i)) for batch in dataset for u, i in zip(batch.users, batch.items))
    assert sorted((int(u), int(i)) for s in strata for u, i in zip(s.users, s.items)) == every
    mean = len(every) / workers**2  # MovieLens is skewed: split by id alone, the strata differ by more
    assert all(abs(len(s) - mean) < 0.05 * mean for s in strata)


def test_a_step_trains_one_batchs_worth_so_the_cursor_counts_epochs(movielens_dir):
    dataset = Dataset.open(str(movielens_dir))
    feed = BlockedFeed(dataset, seed=0, local_steps=16)
    sizes = [len(feed.take(0, step, (4, 9), 9)) for step in range(1, 17)]
    # Each piece is every n-th rating of its stratum: no larger than a batch, and no smaller than the others but by one.
    assert max(sizes) <= round(dataset.manifest.n_train / dataset.n_batches) and max(sizes) - min(sizes) <= 1
    assert feed.layout == (2, 1)  # the worker at index 1 of the live set owns user block 1
    assert feed.home is not None and feed.home[feed.take(0, 1, (4, 9), 9).users].all()


def every_rating(dataset):
    batches = [dataset.batch(i) for i in range(dataset.n_batches)]
    return [np.concatenate([getattr(b, name) for b in batches]) for name in ("users", "items", "ratings")]


def test_prepare_writes_the_training_ratings_by_user_shard(movielens_dir):
    dataset = Dataset.open(str(movielens_dir))
    assert dataset.manifest.user_shards == USER_SHARDS
    shard_rows, item_counts = dataset.user_counts()
    users, items, ratings = every_rating(dataset)
    np.testing.assert_array_equal(item_counts, np.bincount(items, minlength=dataset.manifest.n_items))
    for s in range(USER_SHARDS):
        shard, in_shard = dataset.user_shard(s, int(shard_rows[s])), shard_of(users) == s
        # The shard's users' ratings, in the order of the batch files (which prepare shuffled).
        for got, want in zip((shard.users, shard.items, shard.ratings), (users, items, ratings)):
            np.testing.assert_array_equal(got, want[in_shard])


def test_a_data_set_without_user_shards_and_more_than_16_blocks_read_every_batch(movielens_dir, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(movielens_dir, old, ignore=shutil.ignore_patterns("users"))
    doc = json.loads((old / "manifest.json").read_text())
    del doc["user_shards"]  # as prepared before there were user shards
    doc["checksums"] = {k: v for k, v in doc["checksums"].items() if not k.startswith("users/")}
    (old / "manifest.json").write_text(json.dumps(doc))
    for dataset, blocks in ((Dataset.open(str(old)), 2), (Dataset.open(str(movielens_dir)), MAX_BLOCKS + 1)):
        feed = BlockedFeed(dataset, seed=7, local_steps=16)
        assert isinstance(feed.placement, EveryBatch)
        feed.take(0, 1, tuple(range(blocks)), 1)
        users = every_rating(dataset)[0]
        expected = deal(np.bincount(users), blocks) == 1
        np.testing.assert_array_equal(feed.home[:len(expected)], expected)
        assert sum(len(s) for s in feed.strata) == int(expected[users].sum())
    assert type(BlockedFeed(Dataset.open(str(movielens_dir)), seed=7, local_steps=16).placement) is ByUserShard


def test_blocked_rounds_are_averagings():
    blocked = sync_strategy(SyncConfig(protocol="blocked", local_steps=4))
    assert [blocked.publishes(t) for t in range(1, 9)] == [False, False, False, True] * 2
    assert [blocked.must_have_closed(t) for t in (3, 4, 5)] == [0, 4, 4] and blocked.threshold == 0


def test_blocked_is_refused_for_a_model_without_users_and_items(synthetic_lr_dir, tmp_path):
    with pytest.raises(SpecError) as refused:
        from_manifest(manifest(synthetic_lr_dir, model={"type": "logistic-regression"}, sync={"protocol": "blocked"}))
    [line] = str(refused.value).splitlines()[1:]
    assert line.strip() == "spec.sync.protocol: blocked needs spec.model.type pmf, not logistic-regression"
    rules = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    [rule] = [r["rule"] for r in rules if "self.sync.protocol != 'blocked'" in r["rule"]]
    assert "['pmf']" in rule


@pytest.mark.slow
@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_pmf_trains_under_blocked(movielens_dir, tmp_path, redis_url, amqp_url, services):
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    job = job_for(movielens_dir, sync={"protocol": "blocked"}, stop={"maxEpochs": 15, "patience": 0})
    summary = train_local(job, tmp_path, svc, QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["rejected_frames"] == 0
    assert summary["validation_loss"] <= 0.92
    rows = read_metrics(tmp_path)
    assert len(rows) == summary["steps"] and rows[-1]["epoch"] == pytest.approx(15, abs=0.1)
    # The users' rows stay at home: an evaluation's snapshot without the peer's would score its users untrained.
    assert min(r["validation_loss"] for r in rows if r["validation_loss"] is not None) <= 0.92

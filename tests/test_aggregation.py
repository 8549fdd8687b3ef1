"""Aggregation rules (`spec.sync.aggregation`): what each computes, where it is refused, and that one can be added."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mlless.protocol.messages import Update
from mlless.runtime.attack import AttackError, Attack, checked_attack, from_env, parse
from mlless.sync import aggregation as rules
from mlless.sync.exchanges.alltoall import AllToAll
from mlless.sync.exchanges.base import Published
from mlless.sync.sums import sparse_sum
from mlless.spec import SpecError, from_manifest

I32, F32 = np.int32, np.float32


def updates(*pairs: tuple[list[int], list[float]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [np.array(i, I32) for i, _ in pairs], [np.array(v, F32) for _, v in pairs]


# Three honest updates and a scaled sign flip; entry 3 only the first worker sent, entry 4 only the attacker.
HONEST_AND_FLIPPED = updates(([0, 1, 3], [1.0, 2.0, 5.0]), ([0, 1], [1.2, 1.8]), ([0, 1], [0.8, 2.2]),
                             ([0, 1, 4], [-10.0, -20.0, 7.0]))


def test_sum_is_the_sparse_sum():
    idx, val = HONEST_AND_FLIPPED
    for got, expected in zip(rules.aggregation("sum", 0.25).combine(idx, val), sparse_sum(idx, val)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["median", "trimmed-mean", "krum"])
def test_robust_rules_keep_the_honest_step_and_drop_the_flip(name):
    entries, values, carriers = rules.aggregation(name, 0.25).combine(*HONEST_AND_FLIPPED)
    np.testing.assert_array_equal(entries, [0, 1, 3, 4])
    assert np.all(carriers == 4)
    # n times a centre of the honest values, where the sum was dragged to the flip's side
    assert 3.2 <= values[0] <= 4.8 and 6.4 <= values[1] <= 8.8
    assert sparse_sum(*HONEST_AND_FLIPPED)[1][0] < 0
    if name != "krum":  # an entry one worker of four sent is that worker's alone: most updates hold 0 for it
        assert values[2] == 0 and values[3] == 0


def test_median_and_trimmed_mean_against_numpy():
    rng = np.random.default_rng(1)
    idx = [np.sort(rng.choice(50, 30, replace=False)).astype(I32) for _ in range(5)]
    val = [rng.normal(size=30).astype(F32) for _ in range(5)]
    entries, median, _ = rules.aggregation("median", 0.25).combine(idx, val)
    dense = np.zeros((5, len(entries)))
    for row, (i, v) in enumerate(zip(idx, val)):
        dense[row, np.searchsorted(entries, i)] = v
    np.testing.assert_allclose(median, 5 * np.median(dense, axis=0), rtol=1e-6)
    _, trimmed, _ = rules.aggregation("trimmed-mean", 0.2).combine(idx, val)  # f = 1 of 5
    np.testing.assert_allclose(trimmed, 5 * np.sort(dense, axis=0)[1:4].mean(axis=0), rtol=1e-6)


def test_krum_leaves_out_the_update_far_from_the_others():
    idx = [np.arange(3, dtype=I32)] * 5
    val = [np.array(v, F32) for v in ([1, 1, 1], [1.1, 0.9, 1], [0.9, 1.1, 1], [1, 1, 1.1], [50, -50, 50])]
    _, values, _ = rules.aggregation("krum", 0.2).combine(idx, val)
    np.testing.assert_allclose(values, 5 * np.mean(val[:4], axis=0), rtol=1e-6)


def carrier_reference(idx: list[np.ndarray], val: list[np.ndarray], f: int) -> dict[int, float]:
    """carrier-trimmed-mean entry by entry, without a norm bound: k times the trimmed mean of the k carried values."""
    carried: dict[int, list[float]] = {}
    for i, v in zip(idx, val):
        for entry, value in zip(i.tolist(), v.tolist()):
            carried.setdefault(entry, []).append(value)
    out = {}
    for entry, found in carried.items():
        cut = min(f, (len(found) - 1) // 2)
        out[entry] = len(found) * float(np.mean(sorted(found)[cut:len(found) - cut]))
    return out


def sparse_updates(rng: np.random.Generator, n: int, size: int, sent: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    idx = [np.sort(rng.choice(size, sent, replace=False)).astype(I32) for _ in range(n)]
    return idx, [rng.normal(size=sent).astype(F32) for _ in range(n)]


def test_carrier_rule_is_a_trimmed_mean_over_the_updates_that_sent_each_entry():
    """Unlike median, an entry one or two honest updates carry moves as far as the sum moves it."""
    idx, val = sparse_updates(np.random.default_rng(2), 5, 60, 20)
    entries, values, carriers = rules.aggregation("carrier-trimmed-mean", 0.2).combine(idx, val)
    expected = carrier_reference(idx, val, 1)
    np.testing.assert_array_equal(entries, sorted(expected))
    np.testing.assert_allclose(values, [expected[e] for e in entries.tolist()], rtol=1e-5, atol=1e-6)
    assert np.all(carriers == 5)
    lone = np.searchsorted(entries, [e for e in expected if sum(e in i for i in idx) == 1])
    assert len(lone) and values[lone].all() and not rules.aggregation("median", 0.2).combine(idx, val)[1][lone].any()


@pytest.mark.parametrize("scale, kept", [(-0.5, True), (-1.5, True), (-30.0, False), (30.0, False)])
def test_carrier_rule_bounds_what_an_attacker_moves(scale, kept):
    """Entries at least 2f + 1 updates carry stay within their honest values' range; what the attacker adds alone
    is at most the bound in median norms; an update beyond the bound is left out."""
    rng = np.random.default_rng(3)
    rule = rules.aggregation("carrier-trimmed-mean", 0.25)
    idx, val = sparse_updates(rng, 4, 40, 30)
    lone = np.arange(40, 46, dtype=I32)  # entries only the attacker sends
    attacker = np.concatenate([idx[0], lone]), scale * np.concatenate([val[0], rng.normal(size=len(lone))]).astype(F32)
    everyone = idx + [attacker[0]], val + [attacker[1]]
    entries, values, _ = rule.combine(*everyone)
    norms = [float(np.linalg.norm(v)) for v in everyone[1]]
    at = np.searchsorted(entries, lone)
    assert np.linalg.norm(values[at]) <= rule.BOUND * np.median(norms) + 1e-6
    assert kept == (norms[-1] <= rule.BOUND * np.median(norms))
    for column, entry in enumerate(entries.tolist()):
        honest = [float(v[i == entry][0]) for i, v in zip(idx, val) if entry in i]
        carriers = len(honest) + (kept and entry in attacker[0])
        if len(honest) >= 3:
            assert min(honest) - 1e-6 <= values[column] / carriers <= max(honest) + 1e-6
    if not kept:
        np.testing.assert_allclose(values[:len(entries) - len(lone)], rule.combine(idx, val)[1], rtol=1e-6)
        assert not values[at].any()
    else:
        assert values[at].any()


class _Store:
    store_epoch = 0


def test_all_to_all_adds_the_robust_combination_minus_its_own_update():
    idx, val = HONEST_AND_FLIPPED
    rejected: list[str] = []
    exchange = AllToAll(_Store(), 0, lambda r, s: f"{r}:{s}", 2, 1.0, rejected.append, size=10,
                        aggregation=rules.aggregation("median", 0.25))
    exchange.outbox.append(Published(7, "0:7", b"", idx[0], val[0]))
    peers = [Update(r, 7, idx[r], val[r]) for r in (1, 2, 3)]
    bad = Update(9, 7, np.array([0, 0], I32), np.array([1, 1], F32))  # a repeated index
    (added,) = exchange.combined(7, peers + [bad], list(exchange.outbox))
    entries, combined, _ = rules.aggregation("median", 0.25).combine(idx, val)
    own = np.zeros(len(entries))
    own[np.searchsorted(entries, idx[0])] = val[0]
    np.testing.assert_array_equal(added.indices, entries)
    np.testing.assert_allclose(added.values, combined - own, rtol=1e-6)
    assert len(rejected) == 1 and "worker 9" in rejected[0]


class Mean(rules.Aggregation):
    """A rule registered from a test module: the plain mean, times n (the sum again, by the long way)."""

    name = "test-mean"

    def centre(self, dense: np.ndarray) -> np.ndarray:
        return dense.mean(axis=0)


def manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "agg"},
            "spec": {"workers": 4, "model": {"type": "logistic-regression"}, "dataset": {"uri": "/data"}, **spec}}


def test_a_rule_registered_outside_the_package_is_admitted_and_used():
    with pytest.raises(SpecError, match="spec.sync.aggregation|sync.aggregation"):
        from_manifest(manifest(sync={"aggregation": "test-mean"}))
    rules.register(Mean)
    try:
        job = from_manifest(manifest(sync={"aggregation": "test-mean"}))
        rule = rules.aggregation(job.sync.aggregation, job.sync.trim)
        idx, val = HONEST_AND_FLIPPED
        np.testing.assert_allclose(rule.combine(idx, val)[1], sparse_sum(idx, val)[1], rtol=1e-6)
    finally:
        rules.AGGREGATIONS.unregister(Mean.name)


@pytest.mark.parametrize("spec, field", [
    ({"sync": {"aggregation": "median", "protocol": "async"}}, "spec.sync.aggregation: median needs spec.sync.protocol"),
    ({"sync": {"aggregation": "krum", "protocol": "averaging"}}, "spec.sync.aggregation: krum needs spec.sync.protocol"),
    ({"workers": 2, "sync": {"aggregation": "median"}}, "spec.sync.aggregation: median needs spec.workers >= 3"),
    ({"model": {"type": "pmf"}, "sync": {"aggregation": "trimmed-mean"}}, "needs spec.sync.protocol bsp or gradient-averaging or isp or ssp, not blocked"),
    ({"sync": {"aggregation": "median", "trim": 0.5}}, "sync.trim"),
])
def test_combinations_that_make_no_sense_are_refused_naming_the_field(spec, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.").replace("+", r"\+")):
        from_manifest(manifest(**spec))


def test_the_defaults_and_an_admitted_combination():
    job = from_manifest(manifest())
    assert (job.sync.aggregation, job.sync.trim) == ("sum", 0.25)
    assert from_manifest(manifest(sync={"aggregation": "median", "protocol": "bsp"})).sync.aggregation == "median"
    assert from_manifest(manifest(workers=2)).sync.aggregation == "sum"


@pytest.mark.parametrize("text, expected", [
    ("1=sign-flip", Attack(1, "sign-flip")), ("0=scale:-10", Attack(0, "scale", -10.0)),
    ("3=gaussian:0.5", Attack(3, "gaussian", 0.5)),
])
def test_attacks_parse(text, expected):
    assert parse(text) == expected
    assert checked_attack(text, 4) == text


@pytest.mark.parametrize("text", ["x=sign-flip", "1=flip", "1=scale", "1=scale:x", "1=gaussian:-1", "1=sign-flip:2",
                                  "9=sign-flip"])
def test_bad_attacks_are_refused_in_one_line(text):
    with pytest.raises(AttackError, match="--attack"):
        checked_attack(text, 4)


def test_an_attack_is_refused_in_a_pod_and_ignored_by_other_ranks():
    assert from_env({"MLLESS_ATTACK": "1=sign-flip"}, 0) is None
    assert from_env({"MLLESS_ATTACK": "1=sign-flip"}, 1) == Attack(1, "sign-flip")
    with pytest.raises(ValueError, match="operator"):
        from_env({"MLLESS_ATTACK": "1=sign-flip", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, 1)

"""The key names' write rule: every key a builder of `mlless.protocol.keys` names after a rank is that rank's alone."""
from __future__ import annotations

import inspect

import pytest

from mlless.protocol import keys

RANKED = [fn for name, fn in vars(keys).items() if inspect.isfunction(fn) and fn.__module__ == keys.__name__
          and "rank" in inspect.signature(fn).parameters]


def test_there_are_ranked_key_builders():
    assert {fn.__name__ for fn in RANKED} >= {"update", "checkpoint", "final_replica"}


@pytest.mark.parametrize("build", RANKED, ids=lambda fn: fn.__name__)
def test_a_key_named_after_a_rank_is_written_by_that_rank_alone(build):
    """A new builder whose prefix is missing from `keys.RANK_KEYS` would name a key any member may write."""
    args = {name: 7 if name == "rank" else 1 for name in inspect.signature(build).parameters}
    key = build(**args)
    assert keys.writer(key) == 7 and keys.number(key) == 7, key
    assert keys.may_write(7, key) and not keys.may_write(6, key)

"""Sync strategies: what each protocol changes in the loops, chosen by spec.sync.protocol."""
from __future__ import annotations

import numpy as np

from mlless.protocol.layouts import PARAMS, PENDING_INDICES, PENDING_VALUES
from mlless.sync import STRATEGIES, sync_strategy
from mlless.sync.protocols.bsp import Bsp
from mlless.sync.protocols.isp import Isp
from mlless.sync.protocols.ssp import Ssp
from mlless.spec import SyncConfig


def test_each_protocol_answers_threshold_and_staleness():
    bsp, isp, ssp = (sync_strategy(SyncConfig(protocol=p, significance_threshold=0.5, slack=2)) for p in ("bsp", "isp", "ssp"))
    assert (type(bsp), type(isp), type(ssp)) == (Bsp, Isp, Ssp) and {"bsp", "isp", "ssp"} <= set(STRATEGIES)
    assert (bsp.threshold, bsp.staleness) == (0.0, 0)
    assert (isp.threshold, isp.staleness) == (0.5, 0)
    assert (ssp.threshold, ssp.staleness) == (0.0, 2)
    # A worker that has trained step 5 awaits the close of step 5 behind a barrier, of step 3 with slack 2.
    assert (bsp.must_have_closed(5), ssp.must_have_closed(5), ssp.must_have_closed(1)) == (5, 3, 0)
    assert ssp.update_key(1, 7) != ssp.update_key(1, 8)


def test_final_replicas_merge_to_their_mean_but_home_rows_in_full():
    # Two replicas of a 4-entry model over the shared state [1, 1, 1, 1]: the first holds 0.5 unsent at entry 0
    # (blocked: its user's row, trained at home), the second 0.25 at entry 3.
    first = {PARAMS: np.array([1.5, 1, 1, 1], np.float32), PENDING_INDICES: np.array([0], np.int32),
             PENDING_VALUES: np.array([0.5], np.float32)}
    second = {PARAMS: np.array([1, 1, 1, 1.25], np.float32), PENDING_INDICES: np.array([3], np.int32),
              PENDING_VALUES: np.array([0.25], np.float32)}
    for protocol in ("isp", "bsp", "ssp", "averaging", "async"):  # each replica is a whole model: their mean
        merged = sync_strategy(SyncConfig(protocol=protocol)).merge_final_replicas([first, second])
        np.testing.assert_allclose(merged, [1.25, 1, 1, 1.125])
    # blocked's home rows are pending on their owner alone: every pending entry counts in full
    merged = sync_strategy(SyncConfig(protocol="blocked")).merge_final_replicas([first, second])
    np.testing.assert_allclose(merged, [1.5, 1, 1, 1.25])

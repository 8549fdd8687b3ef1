"""Sync strategies: what each protocol changes in the loops, chosen by spec.sync.protocol."""
from __future__ import annotations

from mlless.runtime.sync import STRATEGIES, sync_strategy
from mlless.runtime.sync.bsp import Bsp
from mlless.runtime.sync.isp import Isp
from mlless.runtime.sync.ssp import Ssp
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

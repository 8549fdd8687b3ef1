"""Model averaging (local SGD), as LambdaML's MA: H local steps, then the replicas exchange what they changed.

Each worker trains `spec.sync.localSteps` (H) steps on its own, accumulating what it changes (as the replica
minus the shared state, `training/rounds.py`) without selecting anything; inside a round it waits for no close, and
does not look for one. At the
round's last step it publishes everything accumulated (for sparse models only the entries it touched) and waits
for that step's close, as BSP does every step; then it averages its replica with its peers'.

Each entry becomes the mean of the replicas that changed it in the round: x_i = shared_i + Σ_k δ_k,i / n_i, with
n_i the number of the round's frames (this worker's included) that carry entry i. Every worker reads the same
frames, so every replica computes the same n_i and the shared state stays one. Over dense entries (LR's features,
popular items) this is LambdaML's average of the replicas; a sparse row only one worker touched (most of a PMF's
user rows: each rating is trained by one worker) keeps its full update instead of shrinking by 1/P. Against the
plain sum shared + Σ_k δ_k (the test's strategy in tests/test_sync_plugin.py), on the quick sets of
benchmarks/time_to_quality.py at P = 2, H = 16, three runs each on a loaded 2-core machine, the time to target was
the same within the noise; the mean needed fewer epochs on the ratings (3.1-3.4 against 3.6-4.3), and on the clicks
the sum's loss hovered at the target (the stop rule held only after 8-11 epochs and 20x the bytes in two runs of
three) where each worker's Adam steps, added, overshoot.

A worker's own share of its update, −(1 − 1/n_i) δ_i, is a correction it applies to itself (`Replica.correct`,
which counts it as its contribution for the MLLESS_AUDIT conservation check). The rest holds as under ISP, since a
replica is still the shared state plus its own unsent accumulator: a leaver's unsent accumulator is merged in full
(`Worker._merge_leavers`), a joiner starts from a donor's replica minus its accumulator, checkpoints and
evaluation snapshots are replicas.

Each step is still reported, and the supervisor closes every step, so accounting, stop rules, evaluation and the
auto-tuner see the job step by step, though a round's reports arrive together at its end (runtime/worker.py
`REPORT_BATCH_SECONDS`); a close inside a round names no update and nobody waits for it,
so it is broadcast only if it carries news (a flag: final, snapshot; a change of the worker set; a leaver's
merge), and workers read such a close at the round's end (`SyncStrategy.publishes`, runtime/worker.py
`_await_close`). A worker leaving on
SIGTERM after it published a round's frame and before that round closed is the one case its frame may be lost,
as under BSP.
"""
from __future__ import annotations

import numpy as np

from mlless.protocol import keys
from mlless.protocol.messages import Close, Update
from mlless.sync.base import SyncStrategy, WorkerHalf, register
from mlless.training.models import Model
from mlless.training.rounds import RoundAccumulator


class AveragingHalf(WorkerHalf):
    """At a round's close, each entry becomes the mean of the replicas that changed it."""

    counts_carriers = True

    def combine(self, close: Close, updates: list[Update]) -> None:
        if not updates:
            return  # no peer published at this close: nothing to average with
        own = [p for p in self.exchange.outbox if p.step == close.step]
        carriers = np.bincount(np.concatenate([u.indices for u in updates] + [p.indices for p in own]),
                               minlength=self.replica.params.shape[0]).astype(np.float32)
        super().combine(close, [Update(u.sender, u.step, u.indices, u.values / carriers[u.indices]) for u in updates])
        for published in own:
            self.replica.correct(published.indices, (1 / carriers[published.indices] - 1) * published.values)


@register
class Averaging(SyncStrategy):
    """H = `spec.sync.localSteps` local steps per round; one exchange of every changed entry per round."""

    name = "averaging"
    worker_half = AveragingHalf
    sums_updates = False

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def staleness(self) -> int:
        return self.config.local_steps - 1

    def accumulator(self, model: Model) -> RoundAccumulator:
        return RoundAccumulator(model.params)

    def must_have_closed(self, step: int) -> int:
        """Inside a round, the previous round's close; at its last step, the round's own."""
        return step - step % self.config.local_steps

    def publishes(self, step: int) -> bool:
        return step % self.config.local_steps == 0

    def update_key(self, rank: int, step: int) -> str:
        # Frames exist only at rounds' ends, each behind a barrier: BSP's ring of slots, counted in rounds.
        return keys.update(rank, step // self.config.local_steps, 0)

    @property
    def slots(self) -> int:
        return keys.update_slots(0)

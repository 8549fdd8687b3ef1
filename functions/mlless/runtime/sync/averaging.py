"""Model averaging (local SGD), as LambdaML's MA: H local steps, then the replicas exchange what they changed.

Each worker trains `spec.sync.localSteps` (H) steps on its own, accumulating what it changes in the replica's
significance accumulator (threshold 0) without selecting anything; inside a round it waits for no close. At the
round's last step it publishes everything accumulated (for sparse models only the entries it touched) and waits
for that step's close, as BSP does every step; then it adds its peers' round deltas.

The replicas add each other's deltas, shared + Σ_k δ_k, rather than average them, shared + mean_k δ_k. A sparse
row that only one worker touched in a round (most of a PMF's user rows: each rating is trained by one worker)
keeps its full update instead of shrinking by 1/P, every worker's updates are applied exactly once (what
runtime/audit.py checks), and everything built on "a replica is the shared state plus its own unsent
accumulator" holds unchanged: a leaver's unsent accumulator is merged as under ISP (`Worker._merge_leavers`), a
joiner starts from a donor's replica minus its accumulator, checkpoints and evaluation snapshots are replicas.

Reports still go to the supervisor every step and it closes every step, so accounting, stop rules, evaluation
and the auto-tuner see the job step by step; the closes inside a round name no update. A worker leaving on
SIGTERM after it published a round's frame and before that round closed is the one case its frame may be lost,
as under BSP.
"""
from __future__ import annotations

from mlless.protocol import keys
from mlless.runtime.sync import register
from mlless.runtime.sync.base import SyncStrategy


@register
class Averaging(SyncStrategy):
    """H = `spec.sync.localSteps` local steps per round; one exchange of every changed entry per round."""

    name = "averaging"

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def staleness(self) -> int:
        return self.config.local_steps - 1

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

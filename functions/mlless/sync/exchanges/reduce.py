"""AllReduce and ScatterReduce, as LambdaML runs them: a step's updates are merged once, by an owner, and every other
worker reads the merged frame instead of each peer's (`spec.sync.exchange`: allreduce, scatter-reduce).

The parameters [0, N) are split into K contiguous partitions: K = 1 for AllReduce, the job's worker count
(`spec.workers`) for ScatterReduce. After a step a worker writes its update as K frames, one per partition. At the
step's close, which names the senders, partition k's owner is the ((k + step) mod m)-th of the m senders still live
after the close (all senders if none is): ownership rotates with the step, so no worker always pays the reducer's
extra work, and it follows the close's live set through joins, leaves and the tuner's scale-in. An owner reads
partition k of every peer's update, adds its own, and writes the merged partition: the sum of the updates (union
of indices, values added in float64, stored in float32) and how many updates carry each entry: the usual count
(1, or every update's for a dense partition) as entry 2N, and the others as entries N + i, the frame's tail. Every worker then reads the merged partitions it does not own.

A merged partition travels in float32 whatever `spec.sync.precision` the workers' frames travel in: the sum of
rounded values rounded again to 16 bits would move every replica alike by a rounding no worker's update carries,
which neither a sender's pending update takes back nor the MLLESS_AUDIT check can account for (it measured 7.6e-4
on PMF under ISP in float16, against 1e-6 all-to-all).

A worker's replica already holds its own update, so what it adds is the merged sum minus its own share, as one
update (`peers_share`): for `WorkerHalf.combine` that is the same sum as the peers' own frames. For a strategy that
counts the peers that carry each entry (`WorkerHalf.counts_carriers`), zero-valued updates follow where two or more
peers do: `AveragingHalf.combine` (sync/protocols/averaging.py) then counts the same carriers per entry, so model
averaging divides by the same n_i. An entry only this worker's update carries comes back exactly (a float32 value
summed alone is exact), so its difference is 0 and is left out. Where peers overlap, the replicas agree within float32 rounding of
the merged sum (one ulp per entry per step), as under all-to-all, where each worker adds the same frames in a
different order; every update is applied once, which is what the MLLESS_AUDIT conservation check measures.

An owner that dies (or is dropped) after reporting but before writing its merged partition leaves nothing to
wait for: a reader polls for the merged frame for `patience` seconds (half the worker timeout), then merges that
partition itself from the senders' frames, which are in the store since their reports, and logs it. Nothing is
lost and nothing deadlocks; the step costs that wait, and the supervisor drops the dead worker by its timeout.
Merged frames live in the strategy's ring of slots (`SyncStrategy.update_key`), so a frame of an older step found
in the slot is not the one awaited: its step is checked, and the reader keeps polling.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.messages import Close, Update
from mlless.protocol.precision import FLOAT32
from mlless.sync.exchanges.base import Exchange, Published, register
from mlless.sync.sums import sparse_sum

log = logging.getLogger(__name__)

#: How long a reader first sleeps between polls for a merged frame, and at most (seconds).
POLL_FIRST, POLL_MAX = 0.0003, 0.004


@register
class ScatterReduce(Exchange):
    """Worker i merges partition i of every update; every worker reads the other merged partitions."""

    name = "scatter-reduce"

    @property
    def frames_per_step(self) -> int:
        return self.parts

    def cuts(self) -> np.ndarray:
        """The K − 1 inner boundaries of the partitions of [0, N)."""
        return np.linspace(0, self.size, self.parts + 1).astype(np.int64)[1:-1]

    def part_key(self, rank: int, part: int, step: int) -> str:
        return f"{self.key_of(rank, step)}:{part}"

    def reduced_key(self, part: int, step: int) -> str:
        return f"reduced:{part}:{self.key_of(0, step)}"

    def publish(self, step: int, indices: np.ndarray, values: np.ndarray) -> int:
        if np.any(indices[1:] < indices[:-1]):
            order = np.argsort(indices, kind="stable")
            indices, values = indices[order], values[order]
        at = np.searchsorted(indices, self.cuts())
        return sum(self.write(step, self.part_key(self.rank, part, step), idx, val)
                   for part, (idx, val) in enumerate(zip(np.split(indices, at), np.split(values, at))))

    def gather(self, close: Close) -> list[Update]:
        step, senders = close.step, sorted(close.updates)
        if not [r for r in senders if r != self.rank]:
            return []  # no peer published: nothing to add
        owners = [r for r in senders if r in close.live] or senders
        merged: dict[int, Update] = {}
        for part in range(self.parts):
            if owners[(part + step) % len(owners)] == self.rank:
                merged[part] = self.merge(step, part, senders)
                frame = encode(merged[part], sealed=True)
                self.transport.put(self.reduced_key(part, step), frame)
                self.bytes_merged += len(frame)
        merged.update(self.await_merged(step, [p for p in range(self.parts) if p not in merged], senders, owners))
        own = {p.key: p for p in self.outbox if p.step == step}
        return [u for part in range(self.parts)
                for u in self.peers_share(merged[part], own.get(self.part_key(self.rank, part, step)))]

    def merge(self, step: int, part: int, senders: list[int]) -> Update:
        """Partition `part` of the senders' updates of `step`, summed, with the count of each entry's carriers."""
        peers = [r for r in senders if r != self.rank]
        frames = self.fetch([self.part_key(r, part, step) for r in peers])
        updates = [u for r, frame in zip(peers, frames) if (u := self.checked(r, step, frame)) is not None]
        updates += [Update(self.rank, step, p.indices, p.values) for p in self.outbox
                    if p.step == step and p.key == self.part_key(self.rank, part, step)]
        if not updates:
            return Update(self.rank, step, np.zeros(0, np.int32), np.zeros(0, np.float32))
        if self.aggregation is None:
            entries, sums, counts = sparse_sum([u.indices for u in updates], [u.values for u in updates])
        else:  # every update counts as carrying every entry: the robust rule moves even one only this worker sent
            updates = self.in_range(updates)
            entries, sums, counts = self.aggregation.combine([u.indices for u in updates], [u.values for u in updates])
        # The count most entries have (1 for sparse rows, every update for dense ones) goes last, as entry 2N.
        usual = len(updates) if 2 * np.count_nonzero(counts == len(updates)) > len(counts) else 1
        odd = counts != usual
        return Update(self.rank, step, np.concatenate([entries, entries[odd] + self.size, [2 * self.size]]),
                      np.concatenate([sums.astype(np.float32), counts[odd].astype(np.float32), [usual]]))

    def await_merged(self, step: int, parts: list[int], senders: list[int], owners: list[int]) -> dict[int, Update]:
        """The merged partitions `parts` of `step`, as their owners write them; one whose owner has not written it
        within `patience` seconds this worker merges itself."""
        found: dict[int, Update] = {}
        deadline, delay = time.monotonic() + self.patience, POLL_FIRST
        while len(found) < len(parts):
            waiting = [p for p in parts if p not in found]
            for part, frame in zip(waiting, self.transport.get_many([self.reduced_key(p, step) for p in waiting])):
                if frame is None:
                    continue
                owner = owners[(part + step) % len(owners)]
                try:
                    update = decode(frame)
                    if isinstance(update, Update):
                        self.check_precision(update, FLOAT32.name)
                except FrameError as exc:
                    self.reject(f"merged partition {part} of step {step}: {exc}")
                    found[part] = self.merge(step, part, senders)
                    continue
                if isinstance(update, Update) and update.step == step and update.sender == owner:
                    self.bytes_read += len(frame)
                    found[part] = update
            if len(found) < len(parts):
                if time.monotonic() > deadline:
                    for part in (p for p in parts if p not in found):
                        log.warning("worker %d: no merged partition %d of step %d from worker %d after %.1fs; merging "
                                    "it from the senders' frames", self.rank, part, step,
                                    owners[(part + step) % len(owners)], self.patience)
                        found[part] = self.merge(step, part, senders)
                    break
                time.sleep(delay)
                delay = min(1.5 * delay, POLL_MAX)
        return found

    def peers_share(self, merged: Update, own: Published | None) -> list[Update]:
        """What this worker adds of a merged partition: the sum minus its own update, with each entry carried by
        as many updates as peers carry it (the first holds the values, the others zeros)."""
        tail = int(np.searchsorted(merged.indices, self.size))
        if not tail:
            return []
        entries, values = merged.indices[:tail], merged.values[:tail].copy()
        carriers = np.full(tail, int(merged.values[-1]), np.int64)
        carriers[np.searchsorted(entries, merged.indices[tail:-1] - self.size)] = merged.values[tail:-1].astype(np.int64)
        if own is not None and len(own.indices):
            # the merged entries are sorted and distinct: when they are one run (a dense partition), an index's place
            # is its offset from the first
            dense = int(entries[-1]) - int(entries[0]) == tail - 1
            at = own.indices - entries[0] if dense else np.searchsorted(entries, own.indices)
            if np.any(at < 0) or np.any(at >= tail) or np.any(entries[np.clip(at, 0, tail - 1)] != own.indices):
                self.reject(f"merged partition of step {merged.step} from worker {merged.sender}: it lacks this "
                            "worker's update")
                return []
            values[at] -= own.values
            carriers[at] -= 1
        keep = carriers > 0
        layers = [Update(merged.sender, merged.step, entries[keep], values[keep])]
        for extra in range(1, int(carriers.max(initial=0)) if self.carriers else 1):
            more = carriers > extra
            layers.append(Update(merged.sender, merged.step, entries[more], np.zeros(int(more.sum()), np.float32)))
        return layers


@register
class AllReduce(ScatterReduce):
    """One owner per step merges every update into one frame, which every other worker reads."""

    name = "allreduce"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "parts": 1})


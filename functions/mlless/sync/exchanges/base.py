"""The exchange pattern's contract: who writes which frame where, and who reads what, once a strategy has
something to share.

A pattern is one subclass of `Exchange`, registered (`register`) under the name `spec.sync.exchange` gives it:
`publish` writes what the worker contributes, `gather` returns the updates a worker adds to its replica, already
merged or not. The built-ins are modules of this package: all-to-all (`alltoall.py`), AllReduce and ScatterReduce
(`reduce.py`) and in-store (`instore.py`).

A rule of `spec.sync.aggregation` other than the sum (sync/aggregation.py) is applied where a pattern
combines a step's updates: `AllToAll.gather` hands back that combination minus this worker's own update, and a
reducer merges its partition with it.

What every pattern shares is here too: the outbox of a worker's frames still readable, put back when the store
lost the job's keys, and `fetch`, which waits for a frame the store lost until its sender has re-published it.
"""
from __future__ import annotations

import collections
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

import numpy as np

from mlless.protocol.framing import FrameError, decode, encode
from mlless.protocol.messages import Close, Update
from mlless.protocol.precision import FLOAT32
from mlless.spec.registry import Registry
from mlless.transport import Transport

if TYPE_CHECKING:
    from mlless.sync.aggregation import Aggregation

log = logging.getLogger(__name__)

def _distinct(indices: np.ndarray) -> bool:
    """Whether no index repeats: at once for sorted indices, by sorting a copy otherwise (PMF's updates are not)."""
    steps = np.diff(indices)
    return bool(np.all(steps > 0)) or bool(np.all(np.diff(np.sort(indices)) > 0))


#: Where `rank` publishes its update of a step: `SyncStrategy.update_key`.
KeyOf = Callable[[int, int], str]


@dataclass(frozen=True)
class Published:
    """One frame this worker wrote, with what it carries (a leaver takes back what no peer will apply)."""

    step: int
    key: str
    frame: bytes
    indices: np.ndarray
    values: np.ndarray


class Exchange(ABC):
    """How one worker's updates reach its peers: written by `publish`, read at a step-close by `gather`."""

    name: ClassVar[str]

    def __init__(self, transport: Transport, rank: int, key_of: KeyOf, slots: int, patience: float,
                 reject: Callable[[str], None], size: int = 0, parts: int = 1, carriers: bool = True,
                 aggregation: Aggregation | None = None, precision: str = FLOAT32.name) -> None:
        """`slots` steps of this worker's frames stay readable (its outbox); a frame the store lost is waited for
        `patience` seconds; `reject` counts and logs a frame that cannot be applied. `size` is the model's parameter
        count and `parts` the job's worker count, for a pattern that splits the parameters. `carriers`: `gather`
        must show how many peers' updates carry each entry (`WorkerHalf.counts_carriers`). `aggregation`: a rule
        that combines a step's updates other than by adding them (sync/aggregation.py); None adds them.
        `precision`: what the frames' values travel in (`spec.sync.precision`), a frame in another is rejected."""
        self.aggregation = None if aggregation is None or aggregation.adds else aggregation
        self.transport = transport
        self.rank = rank
        self.key_of = key_of
        self.patience = patience
        self.reject = reject
        self.size = size
        self.parts = parts
        self.carriers = carriers
        self.precision = precision
        self.outbox: collections.deque[Published] = collections.deque(maxlen=slots * self.frames_per_step)
        self.store_epoch = transport.store_epoch
        self.repaired = 0  # peers' frames the store lost, read again once their senders re-published them
        # Bytes of frames read from the store, and written at a close (a merged frame), since the last report.
        self.bytes_read = self.bytes_merged = 0

    @property
    def frames_per_step(self) -> int:
        """How many frames `publish` writes for one step."""
        return 1

    @abstractmethod
    def publish(self, step: int, indices: np.ndarray, values: np.ndarray) -> int:
        """Share this worker's update of `step`; returns the bytes written."""

    @abstractmethod
    def gather(self, close: Close) -> list[Update]:
        """The peers' updates of `close.step` this worker adds to its replica (`close.updates` published one)."""

    def traffic(self) -> tuple[int, int]:
        """The bytes written at closes and read since the last call, for the worker's next report."""
        traffic, self.bytes_merged, self.bytes_read = (self.bytes_merged, self.bytes_read), 0, 0
        return traffic

    def write(self, step: int, key: str, indices: np.ndarray, values: np.ndarray) -> int:
        """Put one update frame under `key`, keeping it in the outbox with the values it carries; returns its size."""
        update = Update(sender=self.rank, step=step, indices=indices, values=values, precision=self.precision)
        frame = self.stored(step, encode(update, sealed=True))
        self.transport.put(key, frame)
        self.outbox.append(Published(step, key, frame, update.indices, update.values))
        self.republish_if_store_lost()
        return len(frame)

    def stored(self, step: int, frame: bytes) -> bytes:
        """What `write` stores for the update `frame` of `step`: the frame, unless a pattern's store must read more."""
        return frame

    def opened(self, stored: bytes) -> bytes:
        """The update frame in what `stored` made of it, as `fetch` read it."""
        return stored

    def unread(self, after: int) -> list[Published]:
        """This worker's frames of steps after `after`: once the close of `after` took it out of the job, no peer
        applies them."""
        return [p for p in self.outbox if p.step > after]

    def republish_if_store_lost(self) -> None:
        """Put this worker's readable frames back if the store lost the job's keys since it last looked."""
        if self.transport.store_epoch == self.store_epoch:
            return
        self.store_epoch = self.transport.store_epoch
        for published in self.outbox:
            self.transport.put(published.key, published.frame)
        log.warning("worker %d: the store lost the job's keys; re-published %d update frames", self.rank, len(self.outbox))

    def fetch(self, names: list[str]) -> list[bytes | None]:
        """The frames under `names`, each announced by a report, so it was written.

        One that is missing was lost with the store (a Redis restarted without persistence): its sender still
        holds it and re-publishes it once its own transport notices the loss, as this worker does its own first.
        It is waited for, for at most `patience` seconds (half the supervisor's patience with this worker).
        """
        frames = self.transport.get_many(names)
        # A loss this read noticed is repaired even if nothing is missing here: peers may be waiting for this
        # worker's frames (each re-publishes only its own, and only once its transport noticed).
        self.republish_if_store_lost()
        self.bytes_read += sum(len(f) for f in frames if f is not None)
        deadline = time.monotonic() + self.patience
        delay = 0.01
        while None in frames and time.monotonic() < deadline:
            self.republish_if_store_lost()
            time.sleep(delay)
            delay = min(2 * delay, 0.5)
            missing = [i for i, f in enumerate(frames) if f is None]
            for i, frame in zip(missing, self.transport.get_many([names[i] for i in missing])):
                frames[i] = frame
                self.repaired += frame is not None
                self.bytes_read += len(frame) if frame is not None else 0
        return frames

    def combined(self, step: int, updates: list[Update], own: list[Published]) -> list[Update]:
        """The robust rule's combination of a step's `updates` and this worker's `own` frames of it, as the one update
        this worker adds: its replica holds its own update already."""
        assert self.aggregation is not None
        valid = self.in_range([Update(self.rank, step, p.indices, p.values) for p in own] + updates)
        entries, values, _ = self.aggregation.combine([u.indices for u in valid], [u.values for u in valid])
        for p in own:
            values[np.searchsorted(entries, p.indices)] -= p.values
        return [Update(self.rank, step, entries.astype(np.int32), values.astype(np.float32))] if len(entries) else []

    def in_range(self, updates: list[Update]) -> list[Update]:
        """`updates` without those whose indices are out of range or repeated, which are rejected: a rule other than
        the sum combines them before the replica's apply would find them."""
        valid = []
        for update in updates:
            idx = update.indices
            if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= self.size or not _distinct(idx)):
                self.reject(f"update frame of worker {update.sender} for step {update.step}: indices out of range "
                            f"for {self.size} parameters or repeated")
            else:
                valid.append(update)
        return valid

    def check_precision(self, update: Update, expected: str | None = None) -> None:
        """FrameError unless `update` travelled in the `expected` precision, by default the job's."""
        expected = expected or self.precision
        if update.precision != expected:
            raise FrameError(f"its values travel in {update.precision}, expected {expected}")

    def checked(self, sender: int, step: int, frame: bytes | None) -> Update | None:
        """`frame` as `sender`'s update of `step`, or None (rejected) if it is missing or is something else.
        The index range and uniqueness are checked where it is applied, in one pass, before anything is added."""
        try:
            if frame is None:
                raise FrameError("missing")
            update = decode(self.opened(frame))
            if not isinstance(update, Update) or update.sender != sender or update.step != step:
                raise FrameError(f"expected the update of worker {sender} for step {step}")
            self.check_precision(update)
        except FrameError as exc:
            self.reject(f"update frame of worker {sender} for step {step}: {exc}")
            return None
        return update


#: Every exchange pattern by the name `spec.sync.exchange` gives it; the package imports the built-in ones.
EXCHANGES: Registry[type[Exchange]] = Registry("exchange pattern", "sync.exchange")
register = EXCHANGES.register

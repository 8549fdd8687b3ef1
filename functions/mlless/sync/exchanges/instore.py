"""In-store aggregation, as SPIRT averages inside Redis: a script in the store adds a step's updates, and every worker
reads one frame (`spec.sync.exchange: in-store`).

Each worker writes its update where all-to-all would, as an Update frame followed by its *in-store MAC*: HMAC-SHA1
of the frame under the step key, a key derived for that step alone from what every member of the job holds, the
issuer's public key (`Transport.subkey`): a member can forge another member's contribution here, or the merged
record. At the
step's close, every worker runs the script `instore.lua` (EVALSHA, Lua 5.1 and its `struct` library) with the
close's senders and the step key. The first run of a step reads the senders' frames, verifies each in-store MAC and
the frame (an update of that sender and step, indices in range and distinct, values finite and within ±MAX_MAGNITUDE), adds the valid ones
in float64, writes the merged frame as AllReduce's owner does (`sync/exchanges/reduce.py`: the sum and the count of
each entry's carriers), MACs it under the step key, and keeps the record under the step's merged key. A later run
of the step returns the kept record. A worker then adds the merged sum minus its own update, as under AllReduce.

Who seals what. Redis cannot verify or make the transport's seal (Ed25519: its Lua has only SHA-1,
`redis.sha1hex`), and summing in the store means the store makes the merged frame, so the party trusted to produce
it is the job's Redis, while it runs the script with the key a member of the job gave it. The sum is made at the
first read rather than at each write because only a reader's key can be trusted: the key a writer passed could be
anyone's. What protocol/sealing.py's threat model rules out still fails: a writer without the job key (a forged
contribution, another job's, a frame moved to another sender, slot or step) fails the in-store MAC, is left out of
the sum, named in the record and rejected (counted) by every reader; a record changed after it was made fails its
MAC, and the reader merges the step itself from the senders' sealed frames. What it adds to the trusted party: the
step key passes through Redis in the script's arguments, so whoever can run MONITOR or read the SLOWLOG of the
job's Redis can forge that step's frames (on Kubernetes the job has its own Redis and credentials; a shared Redis
should deny those commands). Each step has its own key, so a key read there is worth one step.

Faults. A contribution missing from the store (a Redis restarted without persistence) makes the script return the
ranks missing and keep nothing: the reader then merges the step itself from the senders' frames, waiting for their
re-publication (`Exchange.fetch`, the JobStore `_alive` mark and its epoch), as an AllReduce reader does when an
owner is gone; the script, lost with the restart, is loaded again (`JobStore.run_script`). The script only adds,
so a robust `spec.sync.aggregation` is refused with it (`spec/robust.py`), and so is the embedded transport, which
has no store to run it in (`runtime/local.py`).

Cost. Redis runs one script at a time and serves nothing else meanwhile: the merge costs a few microseconds per
entry in interpreted Lua, which every client of that Redis waits.
"""
from __future__ import annotations

import hmac
import logging
from importlib import resources

from mlless.protocol.framing import FLAG_SEALED, HEADER, MAGIC, VERSION, FrameError, FrameType, decode
from mlless.protocol.identity import SUPERVISOR
from mlless.protocol.messages import MAX_MAGNITUDE, Close, Update
from mlless.protocol.precision import FLOAT32
from mlless.protocol.sealing import SEAL_BYTES, Verified
from mlless.sync.exchanges.base import register
from mlless.sync.exchanges.reduce import AllReduce

log = logging.getLogger(__name__)

#: Bytes of the in-store MAC (HMAC-SHA1) after a contribution and before a merged frame.
MAC_BYTES = 20
#: The merge, run in Redis, after the frame format's constants it checks, from the modules that define them: a
#: copy in the script would go stale when the format changes, and every contribution would be left out.
SCRIPT = (f"local MAGIC, VERSION, UPDATE, SEALED, HEADER_BYTES = '{MAGIC.decode()}', {VERSION}, "
          f"{int(FrameType.UPDATE)}, {FLAG_SEALED}, {HEADER.size}\n"
          f"local MAC_BYTES, MAX_MAGNITUDE = {MAC_BYTES}, {MAX_MAGNITUDE!r}\n"
          + resources.files("mlless.sync.exchanges").joinpath("instore.lua").read_text())
#: SHA-1's block: HMAC pads its key to this (RFC 2104).
BLOCK = 64


def pads(key: bytes) -> tuple[bytes, bytes]:
    """`key` xor HMAC's inner and outer pads, from which the script computes HMAC-SHA1 with `redis.sha1hex`."""
    padded = key.ljust(BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in padded), bytes(b ^ 0x5C for b in padded)


@register
class InStore(AllReduce):
    """Redis merges a step's updates into one frame, which every worker reads."""

    name = "in-store"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if self.precision != FLOAT32.name:  # the script reads float32 values (`mlless.spec.sync_fields.errors`)
            raise ValueError(f"spec.sync.exchange {self.name} merges float32 frames only, not {self.precision}")

    def step_key(self, step: int) -> bytes:
        return self.transport.subkey(f"in-store step {step}")

    def stored(self, step: int, frame: bytes) -> bytes:
        mac = hmac.new(self.step_key(step), b"c\0", "sha1")
        mac.update(frame)
        return frame + mac.digest()

    def opened(self, stored: bytes) -> bytes:
        # The transport's seal covered the frame and its in-store MAC: the frame is as verified as they are.
        return (Verified(stored[:-MAC_BYTES], stored.signer) if isinstance(stored, Verified) and len(stored) > MAC_BYTES
                else stored)

    def gather(self, close: Close) -> list[Update]:
        step, senders = close.step, sorted(close.updates)
        if not [r for r in senders if r != self.rank]:
            return []  # no peer published: nothing to add
        merged, rejected = self.merged(step, senders)
        if merged is None:
            merged, rejected = self.merge(step, 0, senders), ()
        own = next((p for p in self.outbox if p.step == step), None) if self.rank in senders else None
        return self.peers_share(merged, None if self.rank in rejected else own)

    def merged(self, step: int, senders: list[int]) -> tuple[Update | None, tuple[int, ...]]:
        """The store's merge of the `senders`' updates of `step` and the senders it left out (each rejected here),
        or None if a contribution is missing or the record does not verify."""
        key, listed = self.step_key(step), ",".join(map(str, senders))
        reply = self.transport.run_script(
            SCRIPT, [self.reduced_key(0, step)] + [self.part_key(r, 0, step) for r in senders],
            [step, self.size, self.transport.ttl, *pads(key), SEAL_BYTES, listed, *senders])
        if isinstance(reply, list):
            log.warning("worker %d: the store lacks the updates of workers %s for step %d; merging them from their "
                        "frames once re-published", self.rank, [int(r) for r in reply], step)
            return None, ()
        self.bytes_read += len(reply)
        try:
            head, named, left_out, rest = reply.split(b"|", 3)
            mac, frame = rest[:MAC_BYTES], rest[MAC_BYTES:]
            want = hmac.new(key, b"m\0" + reply[:len(reply) - len(rest)], "sha1")
            want.update(frame)
            if head != b"S%d" % step or named != listed.encode() or not hmac.compare_digest(mac, want.digest()):
                raise FrameError("bad in-store MAC: not merged for this step of this job")
            # Redis merged it (the design above): it speaks for the senders as the supervisor may.
            update = decode(Verified(frame, SUPERVISOR))
            if not isinstance(update, Update) or update.step != step:
                raise FrameError(f"not a merged update of step {step}")
            rejected = tuple(int(r) for r in left_out.split(b",") if r)
        except (ValueError, FrameError) as exc:
            self.reject(f"in-store merge of step {step}: {exc}; merging it from the senders' frames")
            return None, ()
        for rank in rejected:
            self.reject(f"update frame of worker {rank} for step {step}: its in-store MAC or frame does not verify; "
                        "the store left it out of the merge")
        return update, rejected


"""The `spec.sync` fields of norm-isp (SPIRT's norm-based significance filter, sync/protocols/norm.py) and of the
precision update frames travel in (protocol/precision.py), and what they cannot pair with; `schema.py` merges
`FIELDS` into `spec.sync`. The precisions' names are `mlless.contract.PRECISIONS`, which the frames' codecs read
too.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from mlless.contract import PRECISIONS
from mlless.spec.nodes import Schema, choice, number
from mlless.spec.robust import STORE_EXCHANGES

#: norm-isp's threshold. On the digits (examples/digits-cnn.yaml, P = 2, 30 epochs) validation quality held from
#: 0.03 to 10 while the bytes fell from 18 % to 0.8 % of gradient averaging's; at 0.1 a worker sends about every
#: 10 steps, within averaging's `localSteps` (sync/protocols/norm.py has the figures).
NORM_THRESHOLD = 0.1
#: norm-isp's scopes: the whole model's norm, or each of its parameter groups' (`Model.segments`).
NORM_SCOPES = ("model", "layer")

FIELDS: dict[str, Schema] = {
    "normThreshold": number("norm-isp: a worker sends what it accumulated since its last send t' once the sum over the "
                            "steps k = t'..t of ||delta_k|| / ||x_k|| passes this threshold, delta_k being its update "
                            "accumulated from t' to k and x_k its replica (SPIRT's filter for networks); 0 sends "
                            "every step.", 0, default=NORM_THRESHOLD),
    "normScope": choice("norm-isp: model measures the whole model and sends it whole; layer measures each parameter "
                        "tensor of a network on its own (one group for the other models) and sends the tensors "
                        "whose sum passed.", list(NORM_SCOPES), NORM_SCOPES[0]),
    "precision": choice("The precision update and gradient values travel in: float16 and bfloat16 halve the bytes. "
                        "Every replica, the sender's too, applies the rounded values, and what rounding left out of "
                        "an update stays pending on its sender (a gradient's is dropped). float16 holds +-65504 "
                        "(a larger value stops the worker: the training diverged) and 11 significant bits, "
                        "bfloat16 float32's range and 8 bits. The partitions allreduce and scatter-reduce merge "
                        "travel in float32; in-store needs float32.",
                        list(PRECISIONS), PRECISIONS[0]),
}


def errors(spec: Mapping[str, Any]) -> Iterator[str]:
    """One line per way the parsed manifest's `spec` pairs a precision with an exchange that cannot carry it."""
    sync = spec.get("sync") if isinstance(spec.get("sync"), Mapping) else {}
    narrow, exchange = sync.get("precision", PRECISIONS[0]), sync.get("exchange")
    if narrow != PRECISIONS[0] and exchange in STORE_EXCHANGES:  # its script reads float32 (sync/exchanges/instore.lua)
        yield (f"spec.sync.precision: {narrow} cannot run with spec.sync.exchange {exchange}, whose merge in Redis "
               "reads float32 frames only")


def cel_rules() -> list[Schema]:
    """`errors` as the CRD's CEL rules on the spec."""
    return [{"rule": f"!has(self.sync) || !has(self.sync.precision) || self.sync.precision == '{PRECISIONS[0]}' || "
                     f"!has(self.sync.exchange) || !(self.sync.exchange in {list(STORE_EXCHANGES)})",
             "message": f"spec.sync.precision: {', '.join(PRECISIONS[1:])} cannot run with spec.sync.exchange "
                        f"{' or '.join(STORE_EXCHANGES)}"}]

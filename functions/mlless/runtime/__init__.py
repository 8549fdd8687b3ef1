"""The MLLess runtime: supervisor and worker functions, and how a local job launches them."""
from __future__ import annotations

import json
from typing import Any


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw` (an invocation's body, a job state from Redis); ValueError saying what it is not."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise ValueError("not JSON this program reads: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc

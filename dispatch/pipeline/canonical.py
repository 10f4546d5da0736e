"""Canonical arguments and the idempotency key.

The key is computed from validated arguments, so that the same call written with other spacing,
key order or escapes is recognised as the same call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# json.dumps builds a new encoder on every call when given options; one shared encoder is the same.
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(arguments: Mapping[str, Any]) -> str:
    return _encoder.encode(arguments)


def arguments_hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def idempotency_key(*, agent_id: str, session_id: str, tool: str, canonical: str) -> str:
    # The unit separator cannot occur in ids, so no two tuples share a preimage.
    material = "\x1f".join((agent_id, session_id, tool, canonical))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()

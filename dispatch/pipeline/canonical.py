"""Canonical arguments and the idempotency key.

The key is computed from validated arguments, so that the same call written with other spacing,
key order or escapes is recognised as the same call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

# The C encoder JSONEncoder.encode would build for each value, built once: sorted keys, no spaces,
# UTF-8 kept, and the same errors. Its check for cycles is off: it encodes validated arguments and
# the data of results, which hold none (a cycle would end in a RecursionError).
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_encode = c_make_encoder and c_make_encoder(
    None,  # markers: no check for cycles
    json.JSONEncoder().default,
    encode_basestring,
    None,  # indent
    ":",
    ",",
    True,  # sort_keys
    False,  # skipkeys
    True,  # allow_nan, as JSONEncoder's default; strictjson refuses non-finite numbers before
)


# The same, refusing NaN and infinities (ValueError), as json.dumps(allow_nan=False) does: what
# the audit chain hashes (dispatch/pipeline/audit_chain.py).
_strict_encoder = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_encode_strict = c_make_encoder and c_make_encoder(
    None, json.JSONEncoder().default, encode_basestring, None, ":", ",", True, False, False
)


def canonical_json_finite(value: Mapping[str, Any]) -> str:
    """canonical_json, refusing non-finite numbers."""
    if _encode_strict is None:  # an interpreter without json's C accelerator
        return _strict_encoder.encode(value)
    return "".join(_encode_strict(value, 0))


def canonical_json(value: Mapping[str, Any]) -> str:
    """Sorted keys, no spaces, non-ASCII kept: the one JSON text of a value."""
    if _encode is None:  # an interpreter without json's C accelerator
        return _encoder.encode(value)
    return "".join(_encode(value, 0))


def arguments_hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def idempotency_key(*, agent_id: str, session_id: str, tool: str, canonical: str) -> str:
    # The unit separator cannot occur in ids, so no two tuples share a preimage.
    material = "\x1f".join((agent_id, session_id, tool, canonical))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()

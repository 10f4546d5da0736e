"""Drift: an upstream's current OpenAPI document against the one its declarations were reviewed
with. Every operation of the reviewed document must still be offered, at the same method and
path, described the same (parameters, request body and answers, with the schemas they refer to
resolved): a change there may let through a call the upstream now refuses, or refuse one it now
accepts. Operations the upstream added are no drift: only the declared tools are exposed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from upstreams.http import openapi_operations

_DESCRIBED = ("parameters", "requestBody", "responses")
# How deep $refs are followed: enough for any sane schema, and a cycle stops there.
_MAX_DEPTH = 32


def document_drift(reviewed: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What changed, one line an operation and part; empty if nothing did."""
    before, after = openapi_operations(reviewed), openapi_operations(current)
    drift = []
    for name, operation in sorted(before.items()):
        now = after.get(name)
        if now is None:
            drift.append(f"{name}: no longer offered")
            continue
        if (now.method, now.path) != (operation.method, operation.path):
            drift.append(
                f"{name}: moved from {operation.method} {operation.path} to {now.method} {now.path}"
            )
        for part in _DESCRIBED:
            was = _resolved(operation.described.get(part), reviewed, 0)
            is_ = _resolved(now.described.get(part), current, 0)
            if was != is_:
                drift.append(f"{name}: its {part} changed")
    return drift


def _resolved(value: Any, document: Mapping[str, Any], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = document
            for step in ref[2:].split("/"):
                target = target.get(step) if isinstance(target, Mapping) else None
            return _resolved(target, document, depth + 1)
        return {key: _resolved(item, document, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolved(item, document, depth + 1) for item in value]
    return value

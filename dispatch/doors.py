"""What the pipeline's two doors, the agent API (apis.py) and the MCP server (mcp.py), do alike
with what a host sends.

A message is read as strict JSON, with the pipeline's own module, before any library parses it:
a key sent twice, a NaN, a number out of range or text that no database stores is refused at
either door, so that nothing is read one way by a library (the last of two keys, say) and another
by the audit. The model's arguments go on to the pipeline as that reading gave them, at both
doors (a float keeps how it was written). What either door refuses is recorded by
dispatch.security, with its channel.
"""

from __future__ import annotations

import json
from typing import Any

from dispatch.pipeline import strictjson

UNSTORABLE = "which no database can store"


class Unreadable(ValueError):
    """A message neither door reads; the text says why ("not UTF-8", "not strict JSON: ...").

    `field` is the object's top-level field that holds text no database stores, when that is why.
    """

    def __init__(self, problem: str, *, field: str | None = None) -> None:
        super().__init__(problem)
        self.field = field


def message_read(raw: bytes) -> Any:
    """One message as both doors read it: UTF-8, and one strict JSON value; raises Unreadable."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8") from None
    try:
        return strictjson.loads(text)
    except strictjson.UnstorableText as exc:
        field = _field_holding_unstorable_text(text)
        if field is None:
            raise Unreadable(f"not strict JSON: {exc}") from None
        raise Unreadable(f"{exc}, {UNSTORABLE}", field=field) from None
    except strictjson.StrictJSONError as exc:
        raise Unreadable(f"not strict JSON: {exc}") from None


def unstorable(text: str) -> str | None:
    """Why no database stores this text (PostgreSQL keeps no NUL in text, and no encoding writes
    an unpaired surrogate), or None."""
    try:
        strictjson.check_value(text, refuse_nul=True)
    except strictjson.UnstorableText as exc:
        return f"{exc}, {UNSTORABLE}"
    return None


def _field_holding_unstorable_text(text: str) -> str | None:
    # Read again leniently, only to say where: the strict reading has refused it already.
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    for field, value in document.items():
        try:
            strictjson.check_value(field)
        except strictjson.UnstorableText:
            # A name that cannot be shown back.
            return None
        try:
            strictjson.check_value(value)
        except strictjson.UnstorableText:
            return str(field)
        except strictjson.StrictJSONError:
            continue
    return None

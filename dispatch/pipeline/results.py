"""The result contract: the one shape every call gets back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_json as _to_json

from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK, Code


@dataclass(frozen=True, init=False)
class CallResult:
    call_id: str
    ok: bool
    tool: str
    code: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
    replayed: bool = False
    retryable: bool = False
    model_text: str = ""

    # Written out, and as frozen as the generated one (docs/benchmarks.md, "The core").
    def __init__(
        self,
        call_id: str,
        ok: bool,
        tool: str,
        code: str,
        message: str,
        data: Mapping[str, Any] | None = None,
        replayed: bool = False,
        retryable: bool = False,
        model_text: str = "",
    ) -> None:
        self.__dict__.update(
            call_id=call_id,
            ok=ok,
            tool=tool,
            code=code,
            message=message,
            data={} if data is None else data,
            replayed=replayed,
            retryable=retryable,
            model_text=model_text,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "ok": self.ok,
            "tool": self.tool,
            "code": self.code,
            "message": self.message,
            "data": dict(self.data),
            "replayed": self.replayed,
            "retryable": self.retryable,
            "model_text": self.model_text,
        }

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> CallResult:
        return cls(
            call_id=str(stored["call_id"]),
            ok=bool(stored["ok"]),
            tool=str(stored["tool"]),
            code=str(stored["code"]),
            message=str(stored["message"]),
            data=dict(stored.get("data") or {}),
            replayed=bool(stored.get("replayed", False)),
            retryable=bool(stored.get("retryable", False)),
            model_text=str(stored.get("model_text", "")),
        )


# It checks for cycles: it encodes whatever object a host sent.
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def compact_json(value: object) -> str:
    return _compact.encode(value)


def model_text_for(
    code: Code, tool: str, message: str, data: Mapping[str, Any], retryable: bool
) -> str:
    """The compact text an agent host hands back to the model as the tool result."""
    if code is OK:
        # Compact JSON in the order the tool gave its data: its id first, as a model reads it best.
        return f"OK {tool}: {_to_json(data).decode()}"
    if code is CONFIRMATION_REQUIRED:
        return (
            f"PENDING {tool}: held for human approval as confirmation "
            f"{data.get('confirmation_id')} until {data.get('expires_at')}. "
            "Tell the user it awaits approval; do not send this call again. For its outcome, "
            "call get_confirmation_status with this confirmation_id where you have that tool: "
            "asking while it waits costs nothing."
        )
    if code.model_fixable:
        advice = "Correct the call and send it again, or ask the user."
    elif retryable:
        advice = "The same call may succeed if sent again shortly."
    else:
        advice = "Do not repeat this call."
    return f"ERROR {code.name} {tool}: {message} {advice}"


def make_result(
    *,
    call_id: str,
    tool: str,
    code: Code,
    message: str,
    data: Mapping[str, Any] | None = None,
    retryable: bool | None = None,
) -> CallResult:
    payload = dict(data) if data else {}
    is_retryable = code.retryable if retryable is None else retryable
    return CallResult(
        call_id,
        code is OK,
        tool,
        code.name,
        message,
        payload,
        False,
        is_retryable,
        model_text_for(code, tool, message, payload, is_retryable),
    )

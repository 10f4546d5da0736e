"""A message as Toolgate reads it before the SDK does, over both transports.

The SDK parses each message before any handler sees it, and keeps the last of two keys where the
API refuses them; so each message is read first where its bytes are (StrictMessages over HTTP,
StrictLines over stdio) as the API reads a body (dispatch.doors), and refused here otherwise,
recorded as a security event as the API records a malformed body. What the door read of a
tools/call's arguments is kept, by request id, for the call to run on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp.types as types

from dispatch import doors
from dispatch.errors import error_body
from dispatch.models import Agent
from dispatch.security import Origin, security_event_record

MALFORMED_MESSAGE = "malformed_message"

ReadArguments = dict[types.RequestId, Mapping[str, Any]]


def unreadable_answer(
    origin: Origin, agent: Agent | None, raw: bytes, unreadable: doors.Unreadable
) -> types.JSONRPCError:
    """A message that is not strict JSON (dispatch.doors), which the SDK would have read its own
    way (the last of two keys): recorded as the API records a malformed body, and answered with a
    JSON-RPC parse error carrying the API's error; nothing reaches a tool."""
    where = f"'s {unreadable.field}:" if unreadable.field else " is"
    message = f"The message{where} {unreadable}; nothing was done."
    security_event_record(
        origin=origin, agent=agent, status=400, reason=MALFORMED_MESSAGE, detail=message
    )
    request_id, _ = message_head(raw)
    api_error = error_body(status_code=400, code=MALFORMED_MESSAGE, message=message)["error"]
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=types.PARSE_ERROR, message=message, data=api_error),
    )


def tool_call_arguments(message: Any) -> ReadArguments:
    """The arguments of each tools/call request in a message (or a batch) as the door read it,
    by request id."""
    found: ReadArguments = {}
    for request in message if isinstance(message, list) else [message]:
        if not isinstance(request, dict) or request.get("method") != "tools/call":
            continue
        request_id, params = request.get("id"), request.get("params")
        arguments = params.get("arguments") if isinstance(params, dict) else None
        # An id is a string or an integer; JSON's true is neither, though Python's bool is an int.
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            continue
        if isinstance(arguments, dict):
            found[request_id] = arguments
    return found


def same_arguments(read: Mapping[str, Any], parsed: Mapping[str, Any] | None) -> bool:
    """Whether the door's reading of a tools/call's arguments is the SDK's reading of them."""
    # The same keys, in the same order, and values of the same JSON types: what tells the door's
    # reading of a request from another's that reused its id while it was pending.
    return json.dumps(read) == json.dumps(parsed or {})


def message_head(raw: bytes) -> tuple[types.RequestId | None, str]:
    """The id and the method of a refused message, where they can be read without doubt: the
    id lets the client's request end with the error rather than wait (JSON-RPC's is null
    otherwise), the method is what a security event over stdio names."""
    try:
        # Read leniently, only for these two: objects as their (key, value) pairs, in order.
        pairs = json.loads(raw, object_pairs_hook=tuple)
    except ValueError:
        return None, ""
    if type(pairs) is not tuple:
        return None, ""
    ids = [value for key, value in pairs if key == "id"]
    methods = [value for key, value in pairs if key == "method"]
    request_id = ids[0] if len(ids) == 1 and type(ids[0]) in (int, str) else None
    method = methods[0] if len(methods) == 1 and isinstance(methods[0], str) else ""
    return request_id, method

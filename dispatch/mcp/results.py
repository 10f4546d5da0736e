"""What a tools/call answers over MCP: a Toolgate CallResult as MCP content, structured content
and isError, and a refusal on the host's side in the same result contract (or, where no call can
be answered, as a JSON-RPC error carrying the API's error).

Every tool's outputSchema is the result contract (dispatch.envelopes.CallResultDoc), and every
answer to a tools/call carries it as structured content, a refusal on the host's side too, with
a stable code (the API's own where it means the same).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mcp.types as types

from dispatch.envelopes import CallResultDoc
from dispatch.errors import error_body
from dispatch.pipeline import codes
from dispatch.pipeline.results import CallResult


class HostRefusal(NamedTuple):
    """Why the host's side leaves no way to dispatch a call: the status the API would answer it
    with, its stable code (the API's own where it means the same; the security event's reason,
    and the `code` a client reads in the structured content), and what the model is told."""

    status: int
    reason: str
    message: str
    # Whether the same call sent again may pass (the database back).
    retryable: bool = False


# The database went away under the call (the API's 503 `database_unavailable`): retryable.
DATABASE_UNAVAILABLE = HostRefusal(
    503,
    "database_unavailable",
    "Toolgate: the database is unavailable; nothing was done. Send the same call again in a "
    "moment.",
    retryable=True,
)


def result_schema() -> dict[str, Any]:
    """The result contract as JSON Schema, from the model the API documents its answers with:
    every tool's outputSchema."""
    return CallResultDoc.model_json_schema()


def call_result(result: CallResult) -> types.CallToolResult:
    """The result contract as MCP carries it: model_text for the model, the contract as data.

    A held call is not an error: the model should tell the user it waits for a human.
    """
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.model_text)],
        structured_content=result.as_dict(),
        is_error=not result.ok and result.code != codes.CONFIRMATION_REQUIRED.name,
    )


def refusal_contract(tool: str, refusal: HostRefusal) -> dict[str, Any]:
    """A refusal in the result contract's shape, so that it validates against the outputSchema
    as every answer does: no call was made (an empty call_id), its code is the refusal's and its
    data the status the API would have answered."""
    return CallResult(
        call_id="",
        ok=False,
        tool=tool,
        code=refusal.reason,
        message=refusal.message,
        data={"status": refusal.status},
        retryable=refusal.retryable,
        model_text=refusal.message,
    ).as_dict()


def refusal_result(tool: str, refusal: HostRefusal) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=refusal.message)],
        structured_content=refusal_contract(tool, refusal),
        is_error=True,
    )


def refusal_error(status: int, code: str, message: str) -> types.ErrorData:
    """A refusal on the host's side as a JSON-RPC error: the reason as its message, for the
    client to show, and the API's error for the status and code as its data."""
    return types.ErrorData(
        code=types.INVALID_REQUEST if status < 500 else types.INTERNAL_ERROR,
        message=message,
        data=error_body(status_code=status, code=code, message=message)["error"],
    )

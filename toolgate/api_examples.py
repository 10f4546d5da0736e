"""The agent API's documented examples: one request for each kind of answer, and the answer it
got from the pipeline (api_examples.json), added to the OpenAPI document of POST /api/v1/calls
by a drf-spectacular hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]). They speak of the demo
domain's orders and refunds, which the project wires in, so they live here rather than in
dispatch, which names no domain.

The answers are real results, not written by hand: tests/dispatch/apis/test_examples.py sends
every request through the API on the setting below and checks that its answer is the documented
one (ids and times aside), so an example cannot drift from what the API answers. After a change
of the answers, that test writes them again with TOOLGATE_WRITE_API_EXAMPLES=1.

The setting: customer CUS-1 with ORD-1001 (120.00 BRL) and ORD-1003 (1,000.00 BRL); the agent's
policy refunds without a human below 50.00 BRL, at most 500.00 a call, and counts an identical
call three times in a session before it is a loop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

ANSWERS_FILE = Path(__file__).with_name("api_examples.json")


class CallExample(NamedTuple):
    # A stable key (the answers file's), and how the documentation names it.
    key: str
    summary: str
    description: str
    request: dict[str, Any]
    # Requests sent first in the same setting (the call a replay repeats, the calls of a loop).
    before: tuple[dict[str, Any], ...] = ()


def _call(
    session: str, tool: str, arguments: Any, *, context: str = "", customer: str = "CUS-1"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "session_id": session,
        "customer_id": customer,
        "tool": tool,
        "arguments": arguments,
    }
    if context:
        body["context"] = context
    return body


_REFUND = {"order_id": "ORD-1001", "amount_cents": 2590, "currency": "BRL", "reason": "damaged"}
_READ = _call("chat-ok", "get_order", {"order_id": "ORD-1001"})
_SMALL_REFUND = _call("chat-refund", "refund_order", _REFUND)

CALL_EXAMPLES: tuple[CallExample, ...] = (
    CallExample(
        "ok",
        "OK: a read",
        "The call ran: `data` holds the tool's result.",
        _READ,
    ),
    CallExample(
        "ok_refund",
        "OK: money moved without a human",
        "A refund below the policy's auto-approve amount ran at once.",
        _SMALL_REFUND,
    ),
    CallExample(
        "replayed",
        "Replayed: the same call again",
        "An identical call of the same session (here as raw text, other spacing and key order) "
        "gets the first answer again, marked `replayed`; nothing runs twice.",
        _call(
            "chat-refund",
            "refund_order",
            '{ "reason": "damaged", "currency": "BRL", "amount_cents": 2590, '
            '"order_id": "ORD-1001" }',
        ),
        before=(_SMALL_REFUND,),
    ),
    CallExample(
        "held",
        "Held for a human (CONFIRMATION_REQUIRED)",
        "The call passed every check and waits for a reviewer: `data` names the confirmation and "
        "why it was held. `context` is what the reviewer sees beside it.",
        _call(
            "chat-held",
            "refund_order",
            {**_REFUND, "amount_cents": 8000},
            context="Customer: the blender arrived broken, I want my money back.",
        ),
    ),
    CallExample(
        "rejected_tool",
        "Rejected, tool (UNKNOWN_TOOL)",
        "No tool of that name: the model is told the tools it may call.",
        _call("chat-tool", "lookup_order", {"order_id": "ORD-1001"}),
    ),
    CallExample(
        "rejected_json",
        "Rejected, JSON (INVALID_JSON)",
        "The model's argument text is not one strict JSON object.",
        _call("chat-json", "get_order", "{order_id: ORD-1001"),
    ),
    CallExample(
        "rejected_schema",
        "Rejected, schema (INVALID_ARGUMENTS)",
        "An argument does not match the tool's schema: the message names the field and the fix.",
        _call("chat-schema", "refund_order", {**_REFUND, "amount_cents": 25.90}),
    ),
    CallExample(
        "rejected_loop",
        "Rejected, repetition (LOOP_DETECTED)",
        "The same call sent more often than the policy allows in one session.",
        _call("chat-loop", "get_order", {"order_id": "ORD-1001"}),
        before=tuple(_call("chat-loop", "get_order", {"order_id": "ORD-1001"}) for _ in range(3)),
    ),
    CallExample(
        "rejected_business",
        "Rejected, business rule (CURRENCY_MISMATCH)",
        "The system of record's rules: the order is in BRL, not USD.",
        _call("chat-business", "refund_order", {**_REFUND, "currency": "USD"}),
    ),
    CallExample(
        "rejected_policy",
        "Rejected, policy (POLICY_LIMIT)",
        "More than the agent's policy allows in one call, whoever would approve it.",
        _call(
            "chat-policy",
            "refund_order",
            {**_REFUND, "order_id": "ORD-1003", "amount_cents": 60000},
        ),
    ),
)


def call_answers() -> dict[str, Any]:
    """The documented answers, by example key (empty until they are written)."""
    if not ANSWERS_FILE.exists():
        return {}
    answers: dict[str, Any] = json.loads(ANSWERS_FILE.read_text())
    return answers


def examples_add(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular's post-processing hook: each example's request, and the answer it got,
    on POST /api/v1/calls."""
    operation = result.get("paths", {}).get("/api/v1/calls", {}).get("post")
    if operation is None:
        return result
    answers = call_answers()
    requests = operation["requestBody"]["content"]["application/json"]
    requests["examples"] = {
        example.key: {
            "summary": example.summary,
            "description": example.description,
            "value": example.request,
        }
        for example in CALL_EXAMPLES
    }
    answered = operation["responses"]["200"]["content"]["application/json"]
    answered["examples"] = {
        example.key: {
            "summary": example.summary,
            "description": example.description,
            "value": answers[example.key],
        }
        for example in CALL_EXAMPLES
        if example.key in answers
    }
    return result

"""export_regressions: the rejected payloads of stages 1 to 3, from the audit records, as JSONL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dispatch.models import Agent, AuditRecord
from dispatch.services import call_dispatch
from orders.models import Order
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def export(*args: str) -> tuple[list[dict[str, Any]], str]:
    out, err = StringIO(), StringIO()
    call_command("export_regressions", *args, stdout=out, stderr=err)
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def send(agent: Agent, tool: str, arguments: Any, session: str = "s-1") -> str:
    result = call_dispatch(
        agent=agent, session_id=session, customer_id="CUS-1", tool=tool, arguments=arguments
    )
    return result.code


def record(agent: Agent, *, at: datetime, tool: str, arguments: str, code: str) -> None:
    AuditRecord.objects.create(
        call_id=f"c-{AuditRecord.objects.count()}",
        at=at,
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        tool=tool,
        raw_arguments=arguments,
        ok=False,
        code=code,
        message="as it was then",
        policy_version=1,
        duration_ms=1.0,
    )


def test_it_exports_each_rejected_payload_of_stages_1_to_3_once(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent = make_agent()[0]
    float_amount = json.dumps({**REFUND, "amount_cents": 25.9})
    outcomes = [
        send(agent, "refund_order", float_amount),
        send(agent, "refund_order", float_amount, session="s-2"),
        send(agent, "lookup_order", {"order_id": "ORD-1001"}),
        send(agent, "refund_order", '{"order_id": "ORD-1001",}'),
        send(agent, "get_order", {"order_id": "ORD-1001", "verbose": True}),
        send(agent, "refund_order", {**REFUND, "currency": "USD"}),
        send(agent, "get_order", {"order_id": "ORD-1001"}),
    ]

    cases, summary = export()

    assert outcomes == [
        "INVALID_ARGUMENTS",
        "INVALID_ARGUMENTS",
        "UNKNOWN_TOOL",
        "INVALID_JSON",
        "INVALID_ARGUMENTS",
        "CURRENCY_MISMATCH",
        "OK",
    ]
    assert [(case["tool"], case["arguments"], case["code"]) for case in cases] == [
        ("get_order", '{"order_id":"ORD-1001","verbose":true}', "INVALID_ARGUMENTS"),
        ("lookup_order", '{"order_id":"ORD-1001"}', "UNKNOWN_TOOL"),
        ("refund_order", float_amount, "INVALID_ARGUMENTS"),
        ("refund_order", '{"order_id": "ORD-1001",}', "INVALID_JSON"),
    ]
    assert cases[2]["message"] == (
        "amount_cents: 25.9 is not an integer (send an integer in minor units, such as 2590 for "
        "25.90)"
    )
    assert summary.strip() == "4 new case(s)."


def test_a_tool_the_agent_may_not_call_keeps_the_agents_allowlist(make_agent: MakeAgent) -> None:
    agent = make_agent(allowed_tools=["get_order"])[0]
    send(agent, "refund_order", REFUND)

    cases, _ = export()

    assert cases == [
        {
            "tool": "refund_order",
            "arguments": json.dumps(REFUND, separators=(",", ":"), sort_keys=True),
            "code": "TOOL_NOT_ALLOWED",
            "message": "tool: refund_order is not allowed for this agent",
            "allowed_tools": ["get_order"],
        }
    ]


def test_it_exports_only_the_time_range_and_the_codes_asked_for(make_agent: MakeAgent) -> None:
    agent = make_agent()[0]
    record(
        agent,
        at=datetime(2026, 2, 28, 23, tzinfo=UTC),
        tool="x",
        arguments="{}",
        code="UNKNOWN_TOOL",
    )
    record(
        agent, at=datetime(2026, 3, 1, 9, tzinfo=UTC), tool="y", arguments="{}", code="UNKNOWN_TOOL"
    )
    record(
        agent,
        at=datetime(2026, 3, 1, 10, tzinfo=UTC),
        tool="get_order",
        arguments="{",
        code="INVALID_JSON",
    )
    record(
        agent, at=datetime(2026, 3, 2, 0, tzinfo=UTC), tool="z", arguments="{}", code="UNKNOWN_TOOL"
    )

    in_range, _ = export("--since", "2026-03-01", "--until", "2026-03-02")
    one_code, _ = export("--since", "2026-03-01T00:00:00Z", "--code", "UNKNOWN_TOOL")

    assert [case["tool"] for case in in_range] == ["get_order", "y"]
    assert [case["tool"] for case in one_code] == ["y", "z"]


def test_it_leaves_out_what_it_cannot_replay_faithfully(make_agent: MakeAgent) -> None:
    agent = make_agent()[0]
    at = datetime(2026, 3, 1, 9, tzinfo=UTC)
    # The audit keeps the first 4096 characters of the raw arguments.
    record(agent, at=at, tool="get_order", arguments="[" * 4096, code="INVALID_JSON")
    # Valid arguments, recorded as invalid: the pipeline as it is now would let them through.
    record(
        agent, at=at, tool="get_order", arguments='{"order_id": "ORD-1"}', code="INVALID_ARGUMENTS"
    )

    cases, summary = export()

    assert cases == []
    assert summary.strip() == (
        "0 new case(s); 1 left out (raw arguments cut short by the audit); 1 left out (the "
        "pipeline now gives them another code)."
    )


def test_merging_adds_only_the_new_cases_to_the_corpus(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    agent = make_agent()[0]
    corpus = tmp_path / "corpus.jsonl"
    at = datetime(2026, 3, 1, 9, tzinfo=UTC)
    record(agent, at=at, tool="lookup_order", arguments="{}", code="UNKNOWN_TOOL")
    call_command("export_regressions", "--output", str(corpus), stderr=StringIO())
    record(agent, at=at, tool="lookup_order", arguments="{}", code="UNKNOWN_TOOL")
    record(agent, at=at, tool="fetch_order", arguments="{}", code="UNKNOWN_TOOL")
    err = StringIO()

    call_command("export_regressions", "--output", str(corpus), "--merge", stderr=err)

    lines = corpus.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["tool"] for line in lines] == ["fetch_order", "lookup_order"]
    assert err.getvalue().strip() == f"1 new case(s), 1 kept in {corpus}."


def test_it_writes_look_alike_characters_as_escapes(make_agent: MakeAgent) -> None:
    agent = make_agent()[0]
    send(agent, "get_order", {"order_id": "ORD-\uff11\u200b"})
    out = StringIO()

    call_command("export_regressions", stdout=out, stderr=StringIO())

    assert out.getvalue().isascii()
    assert "\\uff11\\u200b" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--code", "ORDER_NOT_FOUND"], "only codes that depend on the call alone"),
        (["--since", "yesterday"], "not an ISO date or time"),
        (["--merge"], "--merge needs --output"),
    ],
)
def test_it_refuses_what_it_cannot_export(args: list[str], error: str) -> None:
    with pytest.raises(CommandError, match=error):
        call_command("export_regressions", *args, stdout=StringIO(), stderr=StringIO())

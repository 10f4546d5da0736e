"""A refund through an MCP server over streamable HTTP (the payments MCP stand-in in its own
process) executes once, whatever the server does: with its key in `_meta`, in an argument or not
taken at all, answers lost after commit, killed mid-call; what it says that is bad is answered,
never shown raw, never leaking its bearer token; a tool it changed is refused."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from dispatch.models import Agent, AuditRecord, IdempotencyRecord, Movement
from dispatch.outcomes import outcomes_settle
from dispatch.pipeline.results import CallResult
from dispatch.registry import tool_registry
from tests.conftest import MakeAgent
from tests.upstreams import payments_mcp as declarations
from tests.upstreams.conftest import TOKEN, McpPaymentsServer, mcp_registered, wait_for
from tests.upstreams.test_payments import call, in_thread, money_counted, refund
from upstreams.mcp import McpUpstream, schema_drift
from upstreams.models import UpstreamDrift
from upstreams.registry import upstream_load
from upstreams.tools import UpstreamDeclarationError, upstream_tools

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent(
        allowed_tools=["get_payment", "refund_payment"], auto_approve_below_cents=5_000
    )[0]


@pytest.fixture
def one_mcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[McpPaymentsServer]:
    """The variant that takes no key, for what does not depend on the key."""
    yield from mcp_registered(tmp_path, monkeypatch, "none")


@pytest.fixture
def keyed_mcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[McpPaymentsServer]:
    yield from mcp_registered(tmp_path, monkeypatch, "meta")


@pytest.fixture
def payments_by_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[McpPaymentsServer]:
    yield from mcp_registered(tmp_path, monkeypatch, "argument")


def test_a_read_and_a_refund_go_through_once_and_only_declared_tools_are_exposed(
    payments_mcp: McpPaymentsServer, agent: Agent
) -> None:
    read = call(agent, "get_payment", {"payment_id": "PAY-1"})
    first = refund(agent)
    again = refund(agent)

    assert (read.code, read.data["amount_cents"]) == ("OK", 10_000)
    assert (first.code, first.data["amount_cents"]) == ("OK", 2_500)
    assert again.replayed and again.data == first.data
    assert [r["amount_cents"] for r in payments_mcp.refunds()] == [2_500]
    assert money_counted() == 2_500
    # The server offers delete_payment and list_refunds too; no declaration exposes them.
    assert {"delete_payment", "list_refunds", "create_refund"}.isdisjoint(
        spec.name for spec in tool_registry
    )
    key = IdempotencyRecord.objects.get(tool="refund_payment").key
    answered_under_key = list(payments_mcp.state()["answers"])
    assert answered_under_key == ([key] if payments_mcp.honours_idempotency_key else [])


def test_an_answer_lost_after_commit_executes_once(
    payments_mcp: McpPaymentsServer, agent: Agent
) -> None:
    payments_mcp.arm(lose_after_commit=1)

    result = refund(agent)

    assert result.code == "OK"
    assert payments_mcp.state()["received"] >= 1
    assert len(payments_mcp.refunds()) == 1
    assert money_counted() == 2_500


def test_a_key_that_travels_as_an_argument_makes_a_lost_answer_execute_once(
    payments_by_argument: McpPaymentsServer, agent: Agent
) -> None:
    payments_by_argument.arm(lose_after_commit=1)

    result = refund(agent)

    assert result.code == "OK"
    assert payments_by_argument.state()["requests"] == 2
    assert len(payments_by_argument.refunds()) == 1
    assert list(payments_by_argument.state()["answers"]) == [
        IdempotencyRecord.objects.get(tool="refund_payment").key
    ]


def test_a_server_killed_mid_call_refunds_once_when_it_is_back(
    payments_mcp: McpPaymentsServer, agent: Agent
) -> None:
    payments_mcp.arm(hang_after_commit=1)
    answered: list[CallResult] = []
    caller = in_thread(lambda: answered.append(refund(agent)))
    wait_for(lambda: len(payments_mcp.refunds()) == 1)

    payments_mcp.kill()
    caller.join(30)

    assert (answered[0].code, answered[0].data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "unknown")
    assert money_counted() == 2_500
    payments_mcp.start()

    resumed = refund(agent)

    assert resumed.code == "OK"
    assert len(payments_mcp.refunds()) == 1
    assert payments_mcp.state()["payments"]["PAY-1"]["refunded_cents"] == 2_500
    assert money_counted() == 2_500


def test_answers_lost_every_time_stay_unknown_until_the_outcome_read_settles_them(
    keyed_mcp: McpPaymentsServer, agent: Agent
) -> None:
    keyed_mcp.arm(lose_after_commit=10)

    lost = refund(agent)

    assert (lost.code, lost.data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "unknown")
    assert money_counted() == 2_500
    keyed_mcp.arm()
    settled = outcomes_settle(older_than=timedelta(0))
    assert [(s.tool, s.status) for s in settled] == [("refund_payment", "completed")]
    assert refund(agent).replayed
    assert len(keyed_mcp.refunds()) == 1
    assert money_counted() == 2_500


def test_a_server_started_again_between_calls_is_reached_on_a_new_session(
    payments_mcp: McpPaymentsServer, agent: Agent
) -> None:
    assert call(agent, "get_payment", {"payment_id": "PAY-1"}).code == "OK"
    payments_mcp.kill()
    payments_mcp.start()

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})
    write = refund(agent)

    assert (read.code, write.code) == ("OK", "OK")
    assert len(payments_mcp.refunds()) == 1


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="reads another connection's commits while the call is in flight",
)
def test_the_key_and_the_money_commit_before_the_server_is_called(
    keyed_mcp: McpPaymentsServer, agent: Agent
) -> None:
    keyed_mcp.arm(slow_write=1, slow_seconds=1.5)
    answered: list[CallResult] = []
    caller = in_thread(lambda: answered.append(refund(agent)))

    def committed() -> bool:
        record = IdempotencyRecord.objects.filter(tool="refund_payment").first()
        return record is not None and Movement.objects.filter(key=record.key).exists()

    wait_for(committed)
    in_flight = IdempotencyRecord.objects.get(tool="refund_payment").status
    refunded_meanwhile = len(keyed_mcp.refunds())
    caller.join(30)

    assert (in_flight, refunded_meanwhile) == ("in_progress", 0)
    assert answered[0].code == "OK"
    assert len(keyed_mcp.refunds()) == 1


def test_a_write_on_a_server_without_a_key_needs_an_outcome_read_to_start() -> None:
    upstream = McpUpstream(declarations.payments_mcp_upstream(key="none"))
    specs = [dataclasses.replace(spec, outcome_of=None) for spec in declarations.tools(upstream)]

    with pytest.raises(UpstreamDeclarationError, match=r"refund_payment .* no outcome_of"):
        upstream_tools(upstream, specs)
    keyed = McpUpstream(declarations.payments_mcp_upstream(key="meta"))
    assert [s.name for s in upstream_tools(keyed, specs)] == ["get_payment", "refund_payment"]


def test_a_declaration_must_say_one_place_for_the_key_and_review_every_tool(
    tmp_path: Path,
) -> None:
    reviewed = json.loads(declarations.SCHEMAS.read_text())
    del reviewed["list_refunds"]
    partial = tmp_path / "schemas.json"
    partial.write_text(json.dumps(reviewed))
    module = SimpleNamespace(
        UPSTREAM=dataclasses.replace(declarations.UPSTREAM, input_schemas=partial),
        tools=declarations.tools,
    )

    with pytest.raises(UpstreamDeclarationError, match="input schemas lack list_refunds"):
        upstream_load(module)
    with pytest.raises(ValueError, match="one place"):
        dataclasses.replace(declarations.UPSTREAM, idempotency_argument="idempotency_key")


def test_a_server_that_is_down_is_a_retryable_answer(
    one_mcp: McpPaymentsServer, agent: Agent
) -> None:
    one_mcp.kill()

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})
    write = refund(agent)

    assert (read.code, read.retryable) == ("UPSTREAM_UNAVAILABLE", True)
    assert (write.code, write.retryable) == ("UPSTREAM_READ_FAILED", True)
    assert money_counted() == 0


def test_a_server_slower_than_the_time_budget_is_unavailable(
    one_mcp: McpPaymentsServer, agent: Agent
) -> None:
    one_mcp.arm(slow=3, slow_seconds=4)

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})

    assert (read.code, read.data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "not_applied")


@pytest.mark.parametrize("fault", ["malformed", "wrong_schema"])
def test_an_answer_that_is_not_the_declared_one_is_not_shown(
    one_mcp: McpPaymentsServer, agent: Agent, fault: str
) -> None:
    one_mcp.arm(**{fault: 1})

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})

    assert read.code == "UPSTREAM_BAD_ANSWER"
    assert "lots" not in read.message and "not json" not in read.message
    # JSON of another shape is the tool's contract moving, recorded for administrators; an
    # answer that is not JSON at all is a garbled one, and no drift.
    recorded = [(d.tool, d.kind) for d in UpstreamDrift.objects.all()]
    assert recorded == ([("get_payment", "answer_shape")] if fault == "wrong_schema" else [])


def test_a_refusal_with_markup_releases_the_money_and_is_escaped(
    one_mcp: McpPaymentsServer, agent: Agent
) -> None:
    one_mcp.arm(markup=1)

    refused = refund(agent)

    assert refused.code == "UPSTREAM_REFUSED"
    assert "&lt;script&gt;" in refused.message
    assert "<" not in json.dumps(refused.as_dict())
    assert one_mcp.refunds() == []
    assert money_counted() == 0


def test_a_tool_changed_after_start_up_is_refused_after_the_servers_notice(
    one_mcp: McpPaymentsServer, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    assert refund(agent, amount_cents=100).code == "OK"
    one_mcp.arm(tools="tighten", notify=1)
    # The next call (the check's read) carries notifications/tools/list_changed.

    changed = refund(agent, amount_cents=2_000)

    assert (changed.code, changed.retryable) == ("UPSTREAM_CHANGED", False)
    assert "amount_cents" in changed.message
    assert [r["amount_cents"] for r in one_mcp.refunds()] == [100]
    assert one_mcp.state()["received"] == 1
    assert money_counted() == 100
    assert "create_refund: its input schema changed (amount_cents)" in caplog.text
    assert call(agent, "get_payment", {"payment_id": "PAY-1"}).code == "OK"


def test_a_tool_missing_at_call_time_is_refused_as_changed(
    one_mcp: McpPaymentsServer, agent: Agent
) -> None:
    one_mcp.arm(tools="remove")

    missing = refund(agent)

    assert (missing.code, missing.retryable) == ("UPSTREAM_CHANGED", False)
    assert "create_refund: no longer offered" in missing.message
    assert one_mcp.refunds() == []
    assert money_counted() == 0


def test_the_bearer_token_never_appears_in_a_result_the_audit_or_a_log(
    one_mcp: McpPaymentsServer, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    results = [call(agent, "get_payment", {"payment_id": "PAY-1"}), refund(agent)]
    one_mcp.arm(markup=1)
    results.append(refund(agent, amount_cents=3))
    one_mcp.kill()
    results += [call(agent, "get_payment", {"payment_id": "PAY-1"}), refund(agent, amount_cents=4)]

    written = json.dumps([r.as_dict() for r in results])
    audited = json.dumps(
        list(AuditRecord.objects.values_list("message", "raw_arguments", "arguments"))
    )
    assert [r.code for r in results] == [
        "OK",
        "OK",
        "UPSTREAM_REFUSED",
        "UPSTREAM_UNAVAILABLE",
        "UPSTREAM_READ_FAILED",
    ]
    assert TOKEN not in written
    assert TOKEN not in audited
    assert TOKEN not in caplog.text


def test_check_upstreams_compares_each_tools_input_schema_with_the_reviewed_one(
    one_mcp: McpPaymentsServer,
) -> None:
    out, err = StringIO(), StringIO()
    call_command("check_upstreams", stdout=out)
    assert "payments_mcp: as reviewed (get_payment, refund_payment)" in out.getvalue()
    one_mcp.arm(tools="tighten")

    with pytest.raises(CommandError, match="payments_mcp"):
        call_command("check_upstreams", stderr=err)

    assert "create_refund: its input schema changed (amount_cents)" in err.getvalue()


def test_check_upstreams_prints_the_schemas_to_review(one_mcp: McpPaymentsServer) -> None:
    out = StringIO()

    call_command("check_upstreams", schemas="payments_mcp", stdout=out)

    assert json.loads(out.getvalue()) == json.loads(declarations.SCHEMAS.read_text())


def test_schema_drift_ignores_words_and_names_what_decides_a_call() -> None:
    reviewed = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["n"],
    }
    reworded = {**reviewed, "description": "now described", "title": "renamed"}
    looser = {**reviewed, "required": []}
    without_title = {**reviewed, "properties": {"n": {"type": "integer"}}}

    assert schema_drift("t", reviewed, reworded) is None
    assert schema_drift("t", reviewed, looser) == "t: its input schema changed (which are required)"
    assert schema_drift("t", reviewed, without_title) == (
        "t: its input schema changed (title removed)"
    )

"""Every stage and every code of the pipeline, on the in-memory store; each asserts the ledger."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from dispatch.pipeline.state import KeyStatus, Lookup
from orders.book import GatewayFaults
from tests.dispatch.pipeline.conftest import Harness, default_policy


def test_a_valid_small_refund_executes_once_and_lands_in_the_ledger(harness: Harness) -> None:
    result = harness.refund(1000)

    assert result.ok and result.code == "OK"
    assert result.data["amount_cents"] == 1000
    assert result.data["refundable_cents"] == 11_000
    assert harness.ledger_rows == 1
    assert harness.refunded_cents() == 1000


def test_get_order_reads_without_side_effects(harness: Harness) -> None:
    result = harness.call("get_order", '{"order_id": "ORD-1001"}')

    assert result.ok
    assert result.data == {
        "order_id": "ORD-1001",
        "total_cents": 12_000,
        "currency": "BRL",
        "refunded_cents": 0,
        "refundable_cents": 12_000,
    }
    assert harness.ledger_rows == 0


# Stage 0 -------------------------------------------------------------------------------------


def test_it_stops_a_session_past_its_step_budget(harness: Harness) -> None:
    policy = default_policy(step_budget=2)
    for _ in range(2):
        assert harness.call("get_order", '{"order_id": "ORD-1001"}', policy=policy).ok

    result = harness.refund(1000, policy=policy)

    assert result.code == "STEP_LIMIT"
    assert not result.retryable
    assert harness.ledger_rows == 0
    # Stages 1 to 3 ran before the step was counted, but a call over its budget claims no key
    # and its audit record says nothing of its arguments.
    assert len(harness.state.keys) == 1
    audit = harness.state.audit[-1]
    assert (audit.code, audit.step, audit.key, audit.arguments) == ("STEP_LIMIT", 3, None, None)


def test_a_call_over_its_budget_is_refused_whatever_it_holds(harness: Harness) -> None:
    policy = default_policy(step_budget=1)
    assert harness.call("get_order", '{"order_id": "ORD-1001"}', policy=policy).ok

    assert harness.call("get_order", '{"order_id": ', policy=policy).code == "STEP_LIMIT"
    assert harness.call("teleport_order", "{}", policy=policy).code == "STEP_LIMIT"
    assert harness.state.sessions["agent-1", "s-1"][1] == 3


def test_the_step_budget_is_per_session(harness: Harness) -> None:
    policy = default_policy(step_budget=1)
    assert harness.call("get_order", '{"order_id": "ORD-1001"}', policy=policy).ok
    assert harness.call("get_order", '{"order_id": "ORD-1001"}', policy=policy).code == "STEP_LIMIT"
    assert harness.call("get_order", '{"order_id": "ORD-1001"}', session="s-2", policy=policy).ok


# Stage 1 -------------------------------------------------------------------------------------


def test_it_rejects_an_unknown_tool_and_lists_the_allowed_ones(harness: Harness) -> None:
    result = harness.call("delete_order", '{"order_id": "ORD-1001"}')

    assert result.code == "UNKNOWN_TOOL"
    assert "get_order, refund_order" in result.message
    assert harness.ledger_rows == 0


def test_it_rejects_a_tool_missing_from_the_allowlist(harness: Harness) -> None:
    policy = default_policy(allowed_tools=frozenset({"get_order"}))

    result = harness.refund(1000, policy=policy)

    assert result.code == "TOOL_NOT_ALLOWED"
    assert harness.ledger_rows == 0


def test_unknown_tool_lists_only_what_this_agent_may_call(harness: Harness) -> None:
    policy = default_policy(allowed_tools=frozenset({"get_order"}))

    result = harness.call("refund", "{}", policy=policy)

    assert "refund_order" not in result.message


# Stage 2 -------------------------------------------------------------------------------------

NOT_STRICT_JSON = {
    "not json": "refund ORD-1001 please",
    "empty": "",
    "array": "[1, 2]",
    "string": '"ORD-1001"',
    "number": "12",
    "null": "null",
    "single quotes": "{'order_id': 'ORD-1001'}",
    "trailing comma": '{"order_id": "ORD-1001",}',
    "trailing data": '{"order_id": "ORD-1001"} {"order_id": "ORD-1002"}',
    "duplicate keys": '{"order_id": "ORD-1002", "order_id": "ORD-1001"}',
    "NaN": '{"order_id": "ORD-1001", "amount_cents": NaN}',
    "Infinity": '{"order_id": "ORD-1001", "amount_cents": -Infinity}',
    "overflowing number": '{"order_id": "ORD-1001", "amount_cents": 1e400}',
    "lone surrogate": '{"order_id": "ORD-1001\\ud800"}',
    "byte order mark": '\ufeff{"order_id": "ORD-1001"}',
    "comment": '{"order_id": "ORD-1001" /* ok */}',
    "huge": json.dumps({"order_id": "ORD-1001", "note": "x" * 5000}),
    "deeply nested": '{"a":' * 40 + "1" + "}" * 40,
    "absurdly nested": "[" * 100_000 + "]" * 100_000,
    "too many digits": '{"amount_cents": ' + "9" * 5000 + "}",
}


@pytest.mark.parametrize("raw", NOT_STRICT_JSON.values(), ids=NOT_STRICT_JSON.keys())
def test_it_rejects_arguments_that_are_not_one_strict_json_object(
    harness: Harness, raw: str
) -> None:
    result = harness.call("refund_order", raw)

    assert result.code == "INVALID_JSON", result.message
    assert result.message.startswith("arguments: ")
    assert not result.ok and not result.retryable
    assert harness.ledger_rows == 0
    assert len(harness.state.audit) == 1


def test_it_applies_the_same_rules_to_an_object_the_host_parsed(harness: Harness) -> None:
    nested: dict[str, object] = {}
    cursor = nested
    for _ in range(40):
        cursor["a"] = {}
        cursor = cursor["a"]  # type: ignore[assignment]

    assert harness.call("refund_order", nested).code == "INVALID_JSON"
    assert harness.call("refund_order", {"amount_cents": float("nan")}).code == "INVALID_JSON"
    assert harness.call("refund_order", {"n": "x" * 5000}).code == "INVALID_JSON"
    assert harness.ledger_rows == 0


# Stage 3 -------------------------------------------------------------------------------------


def test_it_rejects_float_amounts_with_the_hint_from_the_field(harness: Harness) -> None:
    result = harness.refund(arguments={"amount_cents": 25.90})

    assert result.code == "INVALID_ARGUMENTS"
    assert result.message == (
        "amount_cents: 25.9 is not an integer (send an integer in minor units, such as 2590 for "
        "25.90)"
    )
    assert harness.ledger_rows == 0


BAD_ARGUMENTS = {
    "amount as string": ({"amount_cents": "2590"}, 'amount_cents: "2590" is a string, not an'),
    "amount as bool": ({"amount_cents": True}, "amount_cents: true is a boolean, not an integer"),
    "integral float": ({"amount_cents": 2590.0}, "amount_cents: 2590.0 is not an integer"),
    "zero": ({"amount_cents": 0}, "amount_cents: 0 is below the minimum of 1"),
    "negative": ({"amount_cents": -500}, "amount_cents: -500 is below the minimum of 1"),
    "too large": ({"amount_cents": 10**12}, "amount_cents: 1000000000000 is above the maximum"),
    "lower-case currency": ({"currency": "brl"}, 'currency: "brl" is not one of "BRL", "USD"'),
    "unknown currency": ({"currency": "GBP"}, 'currency: "GBP" is not one of "BRL", "USD"'),
    "unknown reason": ({"reason": "angry"}, 'reason: "angry" is not one of "damaged"'),
    "fullwidth digits": (
        {"order_id": "ORD-\uff11\uff10\uff10\uff11"},
        'order_id: "ORD-\\uff11\\uff10\\uff10\\uff11" does not match',
    ),
    "cyrillic O": ({"order_id": "\u041eRD-1001"}, 'order_id: "\\u041eRD-1001" does not match'),
    "arabic-indic digits": ({"order_id": "ORD-\u0661\u0660\u0660\u0661"}, "does not match"),
    "numeric order id": ({"order_id": 1001}, "order_id: 1001 is a number, not a string"),
    "extra field": ({"refund_to": "CUS-9"}, "refund_to: unknown field"),
    "null": ({"currency": None}, 'currency: null is not one of "BRL", "USD", "EUR"'),
}


@pytest.mark.parametrize(("override", "expected"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_it_rejects_arguments_outside_the_schema(
    harness: Harness, override: dict[str, object], expected: str
) -> None:
    result = harness.refund(arguments=override)

    assert result.code == "INVALID_ARGUMENTS"
    assert expected in result.message
    assert "(" in result.message  # every failing field carries its hint
    assert harness.ledger_rows == 0


def test_it_names_every_failing_field_and_every_missing_one(harness: Harness) -> None:
    result = harness.call("refund_order", '{"order_id": "ORD-1001", "amount_cents": 1.5}')

    parts = result.message.split("; ")
    assert [part.split(":")[0] for part in parts] == ["amount_cents", "currency", "reason"]
    assert "currency: required but not sent (the order's own currency" in result.message
    assert harness.ledger_rows == 0


def test_an_extra_field_names_the_fields_the_tool_takes(harness: Harness) -> None:
    result = harness.call("get_order", '{"order_id": "ORD-1001", "customer_id": "CUS-2"}')

    assert result.message == "customer_id: unknown field (the only fields are: order_id)"


# Stage 4 -------------------------------------------------------------------------------------


def test_a_repeated_refund_is_replayed_without_touching_the_ledger(harness: Harness) -> None:
    first = harness.refund(1000)
    again = harness.call(
        "refund_order",
        '{ "reason":"damaged","currency":"BRL","amount_cents":1000,  "order_id":"ORD-1001"}',
    )

    assert again.replayed and again.ok
    assert again.data == first.data
    assert again.call_id != first.call_id
    assert again.model_text.startswith("REPLAY")
    assert harness.ledger_rows == 1
    assert harness.refunded_cents() == 1000


def test_the_same_call_in_another_session_is_another_call(harness: Harness) -> None:
    harness.refund(1000)
    other = harness.refund(1000, session="s-2")

    # Not a replay: judged anew, and held as a possible duplicate of the first refund.
    assert not other.replayed
    assert other.code == "CONFIRMATION_REQUIRED"
    assert other.data["reason"]["kind"] == "possible_duplicate"
    assert harness.ledger_rows == 1


def test_the_same_read_in_another_session_is_another_call(harness: Harness) -> None:
    harness.call("get_order", {"order_id": "ORD-1001"})
    other = harness.call("get_order", {"order_id": "ORD-1001"}, session="s-2")

    assert other.ok and not other.replayed


def test_it_detects_a_loop_past_the_repeat_limit(harness: Harness) -> None:
    results = [harness.refund(1000) for _ in range(4)]

    assert [r.code for r in results] == ["OK", "OK", "OK", "LOOP_DETECTED"]
    assert "already sent 3 times" in results[3].message
    assert harness.ledger_rows == 1


def test_a_repeated_failing_call_is_judged_anew_until_it_loops(harness: Harness) -> None:
    policy = default_policy(auto_approve_below_cents=100_000)
    results = [harness.refund(20_000, policy=policy)]
    harness.book.add("ORD-1001", "CUS-1", 30_000, "BRL")
    results += [harness.refund(20_000, policy=policy) for _ in range(3)]

    assert [r.code for r in results] == [
        "AMOUNT_EXCEEDS_REFUNDABLE",
        "OK",
        "OK",
        "LOOP_DETECTED",
    ]
    assert [r.replayed for r in results] == [False, False, True, False]
    assert harness.ledger_rows == 1


def test_reads_are_executed_afresh_but_still_counted_as_repeats(harness: Harness) -> None:
    before = harness.call("get_order", '{"order_id": "ORD-1001"}')
    harness.refund(1000)
    after = harness.call("get_order", '{"order_id": "ORD-1001"}')
    harness.call("get_order", '{"order_id": "ORD-1001"}')
    looping = harness.call("get_order", '{"order_id": "ORD-1001"}')

    assert before.data["refunded_cents"] == 0
    assert after.data["refunded_cents"] == 1000 and not after.replayed
    assert looping.code == "LOOP_DETECTED"


def test_an_identical_call_while_held_gets_the_same_confirmation(harness: Harness) -> None:
    first = harness.refund(8000)
    again = harness.refund(8000)

    assert first.code == again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] == first.data["confirmation_id"]
    assert again.replayed and not first.replayed
    assert len(harness.state.confirmations) == 1
    assert harness.ledger_rows == 0


def test_an_expired_confirmation_does_not_hold_a_new_identical_call(harness: Harness) -> None:
    first = harness.refund(8000)
    harness.clock.now += timedelta(hours=2)
    again = harness.refund(8000)

    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] != first.data["confirmation_id"]
    assert not again.replayed


def test_a_call_whose_twin_is_executing_waits_then_says_it_is_in_progress(
    harness: Harness,
) -> None:
    harness.refund(1000)
    key = next(iter(harness.state.keys))
    harness.state.keys[key].status = KeyStatus.IN_PROGRESS

    result = harness.refund(1000)

    assert result.code == "CALL_IN_PROGRESS"
    assert result.retryable
    assert harness.clock.slept  # it waited before answering
    assert harness.ledger_rows == 1


# Stage 5 -------------------------------------------------------------------------------------


def test_it_rejects_an_invented_order_id(harness: Harness) -> None:
    result = harness.refund(1000, arguments={"order_id": "ORD-9999"})

    assert result.code == "ORDER_NOT_FOUND"
    assert result.message.startswith("order_id: no order ORD-9999 exists for this customer")
    assert harness.ledger_rows == 0


def test_another_customers_order_looks_exactly_like_a_missing_one(harness: Harness) -> None:
    foreign = harness.refund(1000, arguments={"order_id": "ORD-1002", "currency": "USD"})
    missing = harness.refund(1000, arguments={"order_id": "ORD-1003", "currency": "USD"})
    read = harness.call("get_order", '{"order_id": "ORD-1002"}')

    assert foreign.code == missing.code == read.code == "ORDER_NOT_FOUND"
    assert foreign.message == missing.message.replace("ORD-1003", "ORD-1002")
    assert foreign.data == missing.data == {}
    assert harness.ledger_rows == 0
    assert harness.refunded_cents("ORD-1002") == 0


def test_it_rejects_a_refund_in_another_currency(harness: Harness) -> None:
    result = harness.refund(1000, arguments={"currency": "USD"})

    assert result.code == "CURRENCY_MISMATCH"
    assert result.message.startswith("currency: order ORD-1001 is in BRL, not USD")
    assert result.data == {"order_currency": "BRL"}
    assert harness.ledger_rows == 0


def test_it_rejects_more_than_what_is_refundable(harness: Harness) -> None:
    harness.refund(4000)
    result = harness.refund(9000)

    assert result.code == "AMOUNT_EXCEEDS_REFUNDABLE"
    assert result.data == {"refundable_cents": 8000}
    assert harness.refunded_cents() == 4000
    assert harness.ledger_rows == 1


# Stage 6 -------------------------------------------------------------------------------------


def test_it_refuses_an_amount_above_the_policy_limit(harness: Harness) -> None:
    policy = default_policy(max_amount_cents=3000)

    result = harness.refund(3001, policy=policy)

    assert result.code == "POLICY_LIMIT"
    assert "amount_cents: 3001 is above this agent's limit of 3000" in result.message
    assert harness.ledger_rows == 0


# Stage 7 -------------------------------------------------------------------------------------


def test_a_refund_above_the_auto_approve_amount_is_held(harness: Harness) -> None:
    result = harness.refund(8000)

    assert result.code == "CONFIRMATION_REQUIRED"
    assert not result.ok and not result.retryable
    data = result.data
    assert data["status"] == "pending"
    assert data["reviewers_required"] == 1
    assert data["arguments"] == {
        "order_id": "ORD-1001",
        "amount_cents": 8000,
        "currency": "BRL",
        "reason": "damaged",
    }
    held = harness.state.confirmations[data["confirmation_id"]]
    assert held.expires_at == harness.clock.now + timedelta(hours=1)
    assert held.customer_id == "CUS-1" and held.policy_version == 1
    assert harness.ledger_rows == 0


def test_large_refunds_need_two_reviewers(harness: Harness) -> None:
    result = harness.refund(20_000, arguments={"order_id": "ORD-1001"}, policy=default_policy())

    # 200.00 is above the order's total: it is refused before any human is asked.
    assert result.code == "AMOUNT_EXCEEDS_REFUNDABLE"
    harness.book.add("ORD-1005", "CUS-1", 90_000, "BRL")
    held = harness.refund(20_000, arguments={"order_id": "ORD-1005"})
    assert held.data["reviewers_required"] == 2


def test_a_policy_with_no_auto_approval_holds_every_refund(harness: Harness) -> None:
    result = harness.refund(1, policy=default_policy(auto_approve_below_cents=0))

    assert result.code == "CONFIRMATION_REQUIRED"
    assert harness.ledger_rows == 0


def test_a_refunds_money_request_is_made_with_its_opening_and_judged_as_made(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store may lock and read the request's history with the opening (dispatch/store): the
    # request it is later asked to reserve must be that very one.
    opened: list[Any] = []
    reserved: list[Any] = []
    open_call, reserve = harness.state.open_call, harness.state.reserve_allowance

    def opening(**kwargs: Any) -> Any:
        opened.append(kwargs["claim"].allowance)
        return open_call(**kwargs)

    def reserving(request: Any, judge: Any) -> Any:
        reserved.append(request)
        return reserve(request, judge)

    monkeypatch.setattr(harness.state, "open_call", opening)
    monkeypatch.setattr(harness.state, "reserve_allowance", reserving)

    assert harness.call("get_order", '{"order_id": "ORD-1001"}').ok
    assert harness.refund(1000).ok

    assert opened[0] is None
    assert len(reserved) == 1 and opened[1] is reserved[0]
    assert (reserved[0].amount_cents, reserved[0].currency, reserved[0].subject) == (
        1000,
        "BRL",
        "ORD-1001",
    )


# Stage 8 -------------------------------------------------------------------------------------


def test_transient_failures_are_retried_with_the_same_key(harness: Harness) -> None:
    harness.book.faults = GatewayFaults(fail_before_commit=2)

    result = harness.refund(1000)

    assert result.ok
    assert harness.clock.slept == [0.05, 0.1]
    assert harness.ledger_rows == 1


def test_when_retries_run_out_before_commit_it_says_nothing_happened(harness: Harness) -> None:
    harness.book.faults = GatewayFaults(fail_before_commit=3)

    result = harness.refund(1000)
    again = harness.refund(1000)

    assert result.code == "UPSTREAM_UNAVAILABLE"
    assert result.retryable and result.data["outcome"] == "not_applied"
    assert again.ok and not again.replayed
    assert harness.ledger_rows == 1


def test_a_response_lost_after_commit_then_retried_refunds_once(harness: Harness) -> None:
    harness.book.faults = GatewayFaults(lose_response_after_commit=1)

    result = harness.refund(1000)

    assert result.ok
    assert harness.ledger_rows == 1
    assert harness.refunded_cents() == 1000


def test_an_outcome_that_cannot_be_known_is_never_a_plain_failure(harness: Harness) -> None:
    harness.book.faults = GatewayFaults(lose_response_after_commit=3)

    result = harness.refund(1000)

    assert result.code == "UPSTREAM_UNAVAILABLE"
    assert result.data["outcome"] == "unknown"
    assert not result.retryable
    assert "may or may not have taken effect" in result.message
    assert harness.ledger_rows == 1

    # Sent again anyway, it finishes under the same key instead of refunding a second time.
    resumed = harness.refund(1000)
    assert resumed.ok and resumed.data["refunded_cents"] == 1000
    assert harness.ledger_rows == 1


def test_a_crashing_handler_is_an_internal_error_with_unknown_outcome(harness: Harness) -> None:
    def explode(**_: object) -> None:
        raise RuntimeError("bug")

    harness.book.refund = explode  # type: ignore[method-assign,assignment]

    result = harness.refund(1000)

    assert result.code == "INTERNAL_ERROR"
    assert result.data == {"outcome": "unknown"}
    assert harness.ledger_rows == 0


def test_a_concurrent_refund_that_empties_the_order_is_refused_at_execution(
    harness: Harness,
) -> None:
    original = harness.book.refund

    def racing_refund(**kwargs: object) -> object:
        harness.book.orders["ORD-1001"] = harness.book.orders["ORD-1001"].__class__(
            "ORD-1001", "CUS-1", 12_000, "BRL", 11_500
        )
        return original(**kwargs)  # type: ignore[arg-type]

    harness.book.refund = racing_refund  # type: ignore[method-assign,assignment]

    result = harness.refund(1000)

    assert result.code == "AMOUNT_EXCEEDS_REFUNDABLE"
    assert harness.ledger_rows == 0


# Audit ---------------------------------------------------------------------------------------


def test_every_call_leaves_exactly_one_audit_record(harness: Harness) -> None:
    harness.call("get_order", '{"order_id": "ORD-1001"}')
    harness.call("nope", "{}")
    harness.call("refund_order", "not json")
    harness.refund(1000)
    harness.refund(1000)
    harness.refund(8000)

    audit = harness.state.audit
    assert [entry.code for entry in audit] == [
        "OK",
        "UNKNOWN_TOOL",
        "INVALID_JSON",
        "OK",
        "OK",
        "CONFIRMATION_REQUIRED",
    ]
    assert [entry.step for entry in audit] == [1, 2, 3, 4, 5, 6]
    assert audit[4].replayed
    assert audit[3].key == audit[4].key
    assert audit[3].arguments == {
        "order_id": "ORD-1001",
        "amount_cents": 1000,
        "currency": "BRL",
        "reason": "damaged",
    }
    assert audit[5].confirmation_id is not None
    assert audit[2].raw_arguments == "not json"


def test_the_audit_keeps_a_bounded_copy_of_the_raw_arguments(harness: Harness) -> None:
    harness.call("refund_order", "x" * 100_000)

    assert len(harness.state.audit[0].raw_arguments) == 4096


def test_it_refuses_a_nul_character_in_any_string(harness: Harness) -> None:
    escaped = harness.call("get_order", '{"order_id": "ORD-1001\\u0000"}')
    in_a_key = harness.call("get_order", {"order_id\x00": "ORD-1001"})

    assert escaped.code == in_a_key.code == "INVALID_JSON"
    assert "NUL" in escaped.message


def test_a_call_names_the_record_its_tool_reads_first_when_it_opens(harness: Harness) -> None:
    lookups = []
    open_call = harness.state.open_call

    def recording_open_call(**opening: Any) -> Any:
        lookups.append(opening["claim"].lookup if opening["claim"] else None)
        return open_call(**opening)

    harness.state.open_call = recording_open_call  # type: ignore[method-assign]

    harness.call("get_order", {"order_id": "ORD-1001"})
    harness.refund()
    harness.call("get_order", {"order_id": 1001})

    the_order = Lookup("orders.order", {"order_id": "ORD-1001", "customer_id": "CUS-1"})
    assert lookups == [the_order, the_order, None]


# The order of the stages -----------------------------------------------------------------------


def _refund(order_id: str, amount_cents: int) -> str:
    arguments = {
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "reason": "damaged",
    }
    return json.dumps(arguments)


@pytest.mark.parametrize(
    ("tool", "arguments", "allowed", "code"),
    [
        # 1 before 2: an unknown tool, with arguments that are not JSON.
        ("teleport_order", '{"order_id": ', ("get_order", "refund_order"), "UNKNOWN_TOOL"),
        # 1 before 3: a tool off the allowlist, with arguments outside its schema.
        ("refund_order", '{"order_id": 1001}', ("get_order",), "TOOL_NOT_ALLOWED"),
        # 5 before 6: an invented order, and an amount above the policy's maximum.
        ("refund_order", _refund("ORD-9999", 60_000), ("refund_order",), "ORDER_NOT_FOUND"),
        # 5 before 6: more than the order has left, and above the maximum.
        (
            "refund_order",
            _refund("ORD-1001", 60_000),
            ("refund_order",),
            "AMOUNT_EXCEEDS_REFUNDABLE",
        ),
        # 6 before 7: above the maximum, and above the auto-approve amount.
        ("refund_order", _refund("ORD-2003", 60_000), ("refund_order",), "POLICY_LIMIT"),
    ],
)
def test_a_call_that_breaks_two_stages_is_answered_by_the_earlier_one(
    harness: Harness, tool: str, arguments: str, allowed: tuple[str, ...], code: str
) -> None:
    policy = default_policy(allowed_tools=frozenset(allowed))

    result = harness.call(tool, arguments, policy=policy)

    assert result.code == code
    assert harness.ledger_rows == 0 and not harness.state.confirmations

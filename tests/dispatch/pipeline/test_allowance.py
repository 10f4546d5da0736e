"""Stage 7 judges the money, not the call: what was moved without a human counts with each call."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from dispatch.pipeline.allowance import (
    AllowanceHistory,
    AllowanceRequest,
    Movement,
    allowance_judge,
)
from tests.dispatch.pipeline.conftest import Harness, default_policy


def refund(
    harness: Harness, order_id: str, amount_cents: int, currency: str = "BRL", **extra: object
) -> str:
    result = harness.refund(
        amount_cents, arguments={"order_id": order_id, "currency": currency}, **extra
    )
    return result.code


def executed_by_policy(harness: Harness) -> int:
    return sum(
        movement.amount_cents
        for _, _, movement in harness.state.movements.values()
        if movement.approval == "policy"
    )


def test_a_split_refund_is_held_once_the_sum_reaches_the_auto_approve_amount(
    harness: Harness,
) -> None:
    small = [refund(harness, "ORD-2003", 4_990 + n) for n in range(9)]

    assert small == ["OK"] + ["CONFIRMATION_REQUIRED"] * 8
    assert harness.refunded_cents("ORD-2003") == 4_990 < 5_000
    assert executed_by_policy(harness) == 4_990


def test_a_held_refund_counts_in_the_sum_of_every_refund_after_it(harness: Harness) -> None:
    large = refund(harness, "ORD-2003", 40_000)

    small = harness.refund(10, arguments={"order_id": "ORD-2003"}, session="s-2")

    assert large == "CONFIRMATION_REQUIRED"
    assert small.code == "CONFIRMATION_REQUIRED"
    assert small.data["reason"]["kind"] == "window_sum"
    assert small.data["reason"]["data"]["held_cents"] == 40_000
    assert small.data["reason"]["data"]["sum_cents"] == 40_010
    assert "held for a reviewer" in small.message
    assert harness.refunded_cents("ORD-2003") == 0


def test_held_refunds_split_across_orders_need_the_reviewers_of_their_sum(
    harness: Harness,
) -> None:
    policy = default_policy(two_reviewers_from_cents=10_000)

    first = harness.refund(6_000, arguments={"order_id": "ORD-1001"}, policy=policy)
    second = harness.refund(6_000, arguments={"order_id": "ORD-2003"}, policy=policy)

    assert (first.data["reviewers_required"], second.data["reviewers_required"]) == (1, 2)
    assert harness.refunded_cents("ORD-1001") + harness.refunded_cents("ORD-2003") == 0


def test_a_rejected_held_refund_no_longer_counts(harness: Harness) -> None:
    large = harness.refund(40_000, arguments={"order_id": "ORD-2003"})
    harness.state.held_decided(large.data["confirmation_id"], approved=False, at=harness.clock.now)

    small = refund(harness, "ORD-2003", 1_000)

    assert small == "OK"
    assert harness.refunded_cents("ORD-2003") == 1_000


def test_an_approved_held_refund_counts_after_its_expiry(harness: Harness) -> None:
    large = harness.refund(40_000, arguments={"order_id": "ORD-2003"})
    harness.state.held_decided(large.data["confirmation_id"], approved=True, at=harness.clock.now)
    harness.clock.now += timedelta(hours=2)

    small = refund(harness, "ORD-2003", 1_000)

    assert small == "CONFIRMATION_REQUIRED"


def test_a_pending_held_refund_stops_counting_at_its_expiry(harness: Harness) -> None:
    refund(harness, "ORD-2003", 40_000)
    harness.clock.now += timedelta(seconds=3601)

    small = refund(harness, "ORD-2003", 1_000)

    assert small == "OK"


def test_the_hold_names_the_earlier_refunds_and_their_sum(harness: Harness) -> None:
    refund(harness, "ORD-1001", 3_000)

    held = harness.refund(2_500, arguments={"order_id": "ORD-2003"})

    reason = held.data["reason"]
    assert reason["kind"] == "window_sum"
    assert reason["data"]["earlier_cents"] == 3_000
    assert reason["data"]["sum_cents"] == 5_500
    assert [earlier["subject"] for earlier in reason["data"]["earlier"]] == ["ORD-1001"]
    assert "3000 BRL was already moved without a human" in held.message


def test_other_agents_and_sessions_count_for_the_same_customer(harness: Harness) -> None:
    refund(harness, "ORD-1001", 3_000, agent="agent-1", session="s-1")

    other = refund(harness, "ORD-2003", 2_500, agent="agent-2", session="s-9")

    assert other == "CONFIRMATION_REQUIRED"
    assert harness.refunded_cents("ORD-2003") == 0


def test_another_customer_or_currency_has_its_own_sum(harness: Harness) -> None:
    refund(harness, "ORD-1001", 4_000)

    usd = refund(harness, "ORD-2004", 4_000, currency="USD")
    other_customer = refund(harness, "ORD-2005", 4_000, customer="CUS-3", session="s-3")

    assert (usd, other_customer) == ("OK", "OK")


def test_money_moved_before_the_window_no_longer_counts(harness: Harness) -> None:
    refund(harness, "ORD-1001", 4_000)
    harness.clock.now += timedelta(hours=24, seconds=1)

    later = refund(harness, "ORD-2003", 4_000)

    assert later == "OK"
    assert harness.refunded_cents("ORD-2003") == 4_000


def test_the_sum_decides_when_two_reviewers_are_needed(harness: Harness) -> None:
    policy = default_policy(two_reviewers_from_cents=6_000)
    refund(harness, "ORD-1001", 4_000, policy=policy)

    held = harness.refund(2_500, arguments={"order_id": "ORD-2003"}, policy=policy)

    assert held.data["reviewers_required"] == 2


def test_past_the_agents_daily_cap_every_refund_is_held(harness: Harness) -> None:
    policy = default_policy(daily_cap_cents=6_000)
    first = refund(harness, "ORD-1001", 4_000, policy=policy)

    second = harness.refund(
        3_000, arguments={"order_id": "ORD-2005"}, customer="CUS-3", session="s-3", policy=policy
    )

    assert first == "OK"
    assert second.code == "CONFIRMATION_REQUIRED"
    assert second.data["reason"]["kind"] == "agent_daily_cap"
    assert harness.refunded_cents("ORD-2005") == 0


def test_the_daily_cap_starts_again_on_the_next_utc_day(harness: Harness) -> None:
    policy = default_policy(daily_cap_cents=6_000, auto_approve_window_seconds=3600)
    refund(harness, "ORD-1001", 4_000, policy=policy)
    harness.clock.now += timedelta(days=1)

    next_day = refund(harness, "ORD-2005", 3_000, customer="CUS-3", session="s-3", policy=policy)

    assert next_day == "OK"


def test_a_refund_that_repeats_an_executed_one_from_another_session_is_held(
    harness: Harness,
) -> None:
    refund(harness, "ORD-1001", 1_000, session="s-1")

    again = harness.refund(
        1_000, arguments={"reason": "customer_request"}, session="s-2", agent="agent-2"
    )

    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["reason"]["kind"] == "possible_duplicate"
    assert again.data["reason"]["data"]["earlier"][0]["subject"] == "ORD-1001"
    assert "ORD-1001" in again.message
    assert harness.refunded_cents() == 1_000


def test_the_model_is_told_of_a_possible_duplicate_without_another_sessions_ids(
    harness: Harness,
) -> None:
    refund(harness, "ORD-1001", 1_000, session="secret-session", agent="other-agent")

    again = harness.refund(1_000, session="s-2")

    assert again.data["reason"]["kind"] == "possible_duplicate"
    assert "secret-session" not in json.dumps(again.as_dict())
    assert "other-agent" not in json.dumps(again.as_dict())


def test_a_held_refund_sent_again_from_another_session_is_held_as_its_possible_duplicate(
    harness: Harness,
) -> None:
    first = harness.refund(8_000, session="s-1")

    again = harness.refund(8_000, session="s-2")

    assert first.data["reason"]["kind"] == "amount"
    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["reason"]["kind"] == "possible_duplicate"
    assert again.data["confirmation_id"] != first.data["confirmation_id"]
    held = harness.state.confirmations[again.data["confirmation_id"]]
    twin = harness.state.movements[held.duplicate_of][2]
    assert twin.confirmation_id == first.data["confirmation_id"]
    assert harness.refunded_cents() == 0


def test_a_refund_the_gateway_refuses_frees_what_it_reserved(harness: Harness) -> None:
    harness.book.faults.fail_before_commit = 3

    failed = refund(harness, "ORD-1001", 4_000)
    after = refund(harness, "ORD-2003", 4_000)

    assert failed == "UPSTREAM_UNAVAILABLE"
    assert after == "OK"
    assert executed_by_policy(harness) == 4_000


def test_a_refund_whose_outcome_is_unknown_keeps_its_reservation(harness: Harness) -> None:
    harness.book.faults.lose_response_after_commit = 3

    unknown = refund(harness, "ORD-1001", 4_000)
    after = refund(harness, "ORD-2003", 2_000)

    assert unknown == "UPSTREAM_UNAVAILABLE"
    assert after == "CONFIRMATION_REQUIRED"


def test_the_judge_lets_through_what_stays_below_every_limit() -> None:
    policy = default_policy(daily_cap_cents=10_000)
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    request = AllowanceRequest(
        "k", "agent-1", "s-1", "CUS-1", "refund_order", "ORD-1", "BRL", 1_000, now, now
    )
    earlier = Movement("k0", "agent-1", "s-1", "refund_order", "ORD-2", 3_999, now, "policy")

    below = allowance_judge(policy, request, AllowanceHistory(3_999, 1, (earlier,), 3_999, ()))
    at_the_line = allowance_judge(
        policy,
        request._replace(amount_cents=1_001),
        AllowanceHistory(3_999, 1, (earlier,), 3_999, ()),
    )

    assert below is None
    assert at_the_line is not None and at_the_line.kind == "window_sum"

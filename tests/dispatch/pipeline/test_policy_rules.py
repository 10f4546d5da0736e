"""A policy per tool and per currency: who decides a tool's calls, and each currency's thresholds in
its own minor units; a currency without thresholds is held for a human."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from dispatch.pipeline.policy import CurrencyLimits, HumanRule, Policy
from dispatch.pipeline.what_if import DraftError, draft_of
from tests.dispatch.pipeline.conftest import Harness, build_harness, default_policy

BRL = CurrencyLimits(max_amount_cents=50_000, auto_approve_below_cents=5_000)


def per_currency(**currencies: CurrencyLimits) -> dict[str, CurrencyLimits]:
    return dict(currencies)


def test_a_currency_without_thresholds_is_held_for_a_human(harness: Harness) -> None:
    policy = default_policy(currencies=per_currency(BRL=BRL))

    usd = harness.refund(100, arguments={"order_id": "ORD-2004", "currency": "USD"}, policy=policy)
    brl = harness.refund(100, policy=policy)

    assert usd.code == "CONFIRMATION_REQUIRED"
    assert usd.data["reason"]["kind"] == "no_thresholds"
    assert "no thresholds for USD" in usd.message
    assert brl.code == "OK"
    assert harness.refunded_cents("ORD-2004") == 0


def test_each_currency_is_judged_by_its_own_thresholds(harness: Harness) -> None:
    policy = default_policy(
        currencies=per_currency(
            BRL=BRL, USD=CurrencyLimits(max_amount_cents=5_000, auto_approve_below_cents=1_000)
        )
    )

    usd = harness.refund(
        2_000, arguments={"order_id": "ORD-2004", "currency": "USD"}, policy=policy
    )
    brl = harness.refund(2_000, policy=policy)
    over = harness.refund(
        5_001, arguments={"order_id": "ORD-2004", "currency": "USD"}, policy=policy
    )

    assert (usd.code, brl.code) == ("CONFIRMATION_REQUIRED", "OK")
    assert over.code == "POLICY_LIMIT"
    assert over.data == {"limit_cents": 5_000, "currency": "USD"}


def test_two_reviewers_are_judged_on_the_currencys_own_line(harness: Harness) -> None:
    policy = default_policy(
        currencies=per_currency(
            BRL=BRL._replace(two_reviewers_from_cents=6_000),
            USD=CurrencyLimits(max_amount_cents=9_000, two_reviewers_from_cents=None),
        )
    )

    brl = harness.refund(7_000, policy=policy)
    usd = harness.refund(
        7_000, arguments={"order_id": "ORD-2004", "currency": "USD"}, policy=policy
    )

    assert (brl.data["reviewers_required"], usd.data["reviewers_required"]) == (2, 1)


def test_a_tool_a_human_always_decides_is_held_however_small(harness: Harness) -> None:
    policy = default_policy(humans=MappingProxyType({"refund_order": HumanRule.ALWAYS}))

    held = harness.refund(1, policy=policy)

    assert held.code == "CONFIRMATION_REQUIRED"
    assert held.data["reason"]["kind"] == "always"
    assert harness.refunded_cents() == 0


def test_a_tool_no_human_decides_moves_money_that_still_counts_in_the_sum(
    harness: Harness,
) -> None:
    never = default_policy(humans=MappingProxyType({"refund_order": HumanRule.NEVER}))
    by_amount = default_policy()

    large = harness.refund(40_000, arguments={"order_id": "ORD-2003"}, policy=never)
    small = harness.refund(100, policy=by_amount)

    assert large.code == "OK"
    assert small.code == "CONFIRMATION_REQUIRED"
    assert small.data["reason"]["kind"] == "window_sum"


def test_a_draft_changes_one_currency_and_may_add_one() -> None:
    policy = default_policy(currencies=per_currency(BRL=BRL))

    draft = draft_of(
        policy,
        {},
        {"BRL": {"auto_approve_below_cents": 9_000}, "JPY": {"max_amount_cents": 30_000}},
    )

    assert draft.limits("BRL") == BRL._replace(auto_approve_below_cents=9_000)
    assert draft.limits("JPY") == CurrencyLimits(max_amount_cents=30_000)
    assert policy.limits("JPY") is None


def test_a_draft_of_a_new_currency_needs_its_maximum() -> None:
    policy = default_policy(currencies=per_currency(BRL=BRL))

    with pytest.raises(DraftError, match="JPY max_amount_cents"):
        draft_of(policy, {}, {"JPY": {"auto_approve_below_cents": 100}})


def test_a_version_with_one_set_for_every_currency_judges_as_each_currency_alike() -> None:
    one_set = default_policy()
    each = default_policy(
        currencies={currency: one_set.limits(currency) or BRL for currency in ("BRL", "USD", "EUR")}
    )
    calls = [(4_000, "ORD-1001", "BRL"), (2_000, "ORD-2003", "BRL"), (3_000, "ORD-2004", "USD")]

    def codes_under(policy: Policy) -> list[str]:
        harness = build_harness()
        return [
            harness.refund(
                amount, arguments={"order_id": order_id, "currency": currency}, policy=policy
            ).code
            for amount, order_id, currency in calls
        ]

    assert codes_under(one_set) == codes_under(each) == ["OK", "CONFIRMATION_REQUIRED", "OK"]

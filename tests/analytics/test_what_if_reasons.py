"""Why the what-if moves each call: the rule that decided it under the draft (the pipeline's own
reason), weighed against the draft's threshold and the one in force."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from analytics.what_if import move_reason
from dispatch.pipeline import allowance
from dispatch.pipeline.policy import CurrencyLimits, HumanRule, Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    OVER_MAXIMUM,
    REFUSED,
    TWO_REVIEWERS,
    Confirmed,
    PastCall,
    Verdict,
    draft_of,
    policy_replay,
)

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
# R$ 50,00 auto-approve, two reviewers from R$ 300,00, R$ 500,00 a call at most.
IN_FORCE = Policy(
    version=1,
    allowed_tools=frozenset({"refund_order"}),
    currencies={"BRL": CurrencyLimits(50_000, 5_000, 30_000, None)},
)
_ids = itertools.count()


def refund(
    minutes: int, cents: int, outcome: str = AUTO_EXECUTED, *, session: str = "", order: str = ""
) -> PastCall:
    number = next(_ids)
    at = T0 + timedelta(minutes=minutes)
    held = (
        Confirmed("pending", at + timedelta(hours=1))
        if outcome in (ONE_REVIEWER, TWO_REVIEWERS)
        else None
    )
    return PastCall(
        at,
        "agent-1",
        session or f"s-{number}",
        "CUS-1",
        "refund_order",
        order or f"ORD-{7000 + number}",
        "BRL",
        cents,
        outcome,
        f"call-{number}",
        confirmation=held,
    )


def last_verdict(draft: Policy, *calls: PastCall) -> Verdict:
    return list(policy_replay(draft, calls))[-1]


def said(verdict: Verdict, draft: Policy) -> str:
    # Amounts are written with a no-break space between the symbol and the figure.
    return move_reason(verdict, IN_FORCE, draft).replace("\xa0", " ")


def brl(**changes: int | None) -> Policy:
    return draft_of(IN_FORCE, {}, {"BRL": changes})


def test_a_call_the_draft_lets_through_says_the_sum_and_both_auto_approve_amounts() -> None:
    draft = brl(auto_approve_below_cents=20_000)

    verdict = last_verdict(draft, refund(0, 4_000), refund(10, 9_000, ONE_REVIEWER))

    assert (verdict.outcome, verdict.rule and verdict.rule.kind) == (
        AUTO_EXECUTED,
        allowance.BELOW_AUTO_APPROVE,
    )
    assert said(verdict, draft) == (
        "With the customer's sum in the window, R$ 130,00 (R$ 40,00 before it), below "
        "R$ 200,00, the draft lets it move without a human (in force: R$ 50,00)."
    )


def test_a_call_held_for_the_window_s_sum_says_the_sum() -> None:
    draft = brl(auto_approve_below_cents=3_000)

    verdict = last_verdict(draft, refund(0, 2_000), refund(10, 1_500))

    assert (verdict.outcome, verdict.reason) == (ONE_REVIEWER, allowance.WINDOW_SUM)
    reason = said(verdict, draft)
    assert "the sum is R$ 35,00: not below R$ 30,00" in reason
    assert reason.endswith("(in force: R$ 50,00).")


def test_a_call_held_for_its_amount_says_the_amount() -> None:
    draft = brl(auto_approve_below_cents=1_000)

    verdict = last_verdict(draft, refund(0, 2_500))

    assert said(verdict, draft) == (
        "R$ 25,00 is not below R$ 10,00, the most this agent may refund without a human "
        "(in force: R$ 50,00)."
    )


def test_one_reviewer_to_two_says_the_two_reviewer_line_not_the_auto_approve_amount() -> None:
    draft = brl(two_reviewers_from_cents=10_000)

    verdict = last_verdict(draft, refund(0, 4_000), refund(10, 9_000, ONE_REVIEWER))

    assert (verdict.outcome, verdict.reviewers and verdict.reviewers.kind) == (
        TWO_REVIEWERS,
        allowance.TWO_REVIEWERS,
    )
    reason = said(verdict, draft)
    assert reason == (
        "The customer's sum with it, R$ 130,00, is not below R$ 100,00, from which the draft "
        "needs two reviewers (in force: R$ 300,00)."
    )
    assert "auto-approve" not in reason


def test_two_reviewers_to_one_without_a_line_says_so() -> None:
    draft = brl(two_reviewers_from_cents=None)

    verdict = last_verdict(draft, refund(0, 35_000, TWO_REVIEWERS))

    assert verdict.outcome == ONE_REVIEWER
    assert said(verdict, draft) == (
        "The draft names no sum from which two reviewers must approve: one is enough "
        "(in force: R$ 300,00)."
    )


def test_a_call_held_by_the_draft_for_two_reviewers_gives_both_rules() -> None:
    draft = brl(auto_approve_below_cents=1_000, two_reviewers_from_cents=2_000)

    verdict = last_verdict(draft, refund(0, 2_500))

    assert verdict.outcome == TWO_REVIEWERS
    reason = said(verdict, draft)
    assert reason.startswith("R$ 25,00 is not below R$ 10,00")
    assert reason.endswith(
        "The customer's sum with it, R$ 25,00, is not below R$ 20,00, from which the draft needs "
        "two reviewers (in force: R$ 300,00)."
    )


def test_a_call_refused_by_the_draft_says_the_maximum() -> None:
    draft = brl(max_amount_cents=10_000)

    verdict = last_verdict(draft, refund(0, 25_000, ONE_REVIEWER))

    assert (verdict.outcome, verdict.reason) == (REFUSED, OVER_MAXIMUM)
    # The pipeline's own refusal, as stage 6 words it for the model.
    assert verdict.rule is not None
    assert "is above this agent's limit of 10000 BRL per call" in verdict.rule.message
    assert said(verdict, draft) == (
        "R$ 250,00 is above R$ 100,00, the most the draft lets an agent move in one call "
        "(in force: R$ 500,00)."
    )


def test_the_daily_cap_is_weighed_against_the_agent_s_day() -> None:
    draft = brl(daily_cap_cents=3_000)
    first = refund(0, 2_000)._replace(customer_id="CUS-2")

    verdict = last_verdict(draft, first, refund(10, 1_500))

    assert (verdict.outcome, verdict.reason) == (ONE_REVIEWER, allowance.AGENT_DAILY_CAP)
    assert said(verdict, draft) == (
        "The agent already moved R$ 20,00 without a human today (UTC); this would pass its "
        "daily cap of R$ 30,00 (in force: none)."
    )


def test_a_possible_duplicate_says_it_may_repeat_another_conversation_s_refund() -> None:
    draft = brl(auto_approve_below_cents=20_000)

    verdict = last_verdict(draft, refund(0, 3_000, order="ORD-5"), refund(10, 3_000, order="ORD-5"))

    assert verdict.reason == allowance.POSSIBLE_DUPLICATE
    assert "possible duplicate" in said(verdict, draft)


def test_a_move_under_the_same_threshold_says_the_calls_before_it_went_another_way() -> None:
    # Refused under the draft, the first refund no longer counts in the second's sum.
    draft = brl(max_amount_cents=4_000)

    verdict = last_verdict(draft, refund(0, 4_500), refund(10, 1_500, ONE_REVIEWER))

    assert verdict.outcome == AUTO_EXECUTED
    assert said(verdict, draft).endswith(
        "(as in force; the calls before it went another way under the draft)."
    )


@pytest.mark.parametrize(
    ("sum_cents", "kind"),
    [(29_999, allowance.ONE_REVIEWER), (30_000, allowance.TWO_REVIEWERS)],
)
def test_the_reviewers_reason_is_the_policy_s_reviewer_count(sum_cents: int, kind: str) -> None:
    reason = allowance.reviewers_reason(IN_FORCE, sum_cents, "BRL")

    assert reason.kind == kind
    assert (IN_FORCE.reviewers_required(sum_cents, "BRL") == 2) == (kind == allowance.TWO_REVIEWERS)
    assert reason.data == {"sum_cents": sum_cents, "two_reviewers_from_cents": 30_000}


def test_a_tool_no_human_decides_says_so() -> None:
    draft = dataclasses.replace(IN_FORCE, humans={"refund_order": HumanRule.NEVER})

    verdict = last_verdict(draft, refund(0, 9_000, ONE_REVIEWER))

    assert said(verdict, draft) == "The draft has no human decide a refund_order."

"""The decision core on its own: who may approve a held call and what the approval does, from plain
values, without a database."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatch.pipeline import codes
from dispatch.pipeline.allowance import APPROVED, HELD, POLICY, HeldSum, Movement
from dispatch.pipeline.decision import (
    ALREADY_DECIDED,
    ALREADY_VOTED,
    POSSIBLE_DUPLICATE,
    SECOND_LOOK_REQUIRED,
    CastVote,
    Decision,
    HeldCall,
    Outcome,
    Reviewer,
    approval_decision,
    approvals_standing,
    closed_reason,
)
from dispatch.pipeline.engine import Refusal
from dispatch.pipeline.policy import CurrencyLimits, Policy

NOW = datetime(2026, 3, 2, 14, 30, tzinfo=UTC)
ANA = Reviewer(1, "ana")
BRUNO = Reviewer(2, "bruno")
CARLA = Reviewer(3, "carla")
TEAM = (ANA, BRUNO, CARLA)


def cents(amount_cents: int, currency: str) -> str:
    return f"{currency} {amount_cents / 100:.2f}"


def policy(**brl: Any) -> Policy:
    limits = {"max_amount_cents": 50_000, "auto_approve_below_cents": 5_000, **brl}
    return Policy(
        version=1,
        allowed_tools=frozenset({"refund_order"}),
        currencies={"BRL": CurrencyLimits(**limits)},
    )


def held(amount_cents: int | None = 6_000, **fields: Any) -> HeldCall:
    values: dict[str, Any] = {
        "status": "pending",
        "expires_at": NOW + timedelta(hours=1),
        "decided_at": None,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "reviewers_required": 1,
    }
    values.update(fields)
    return HeldCall(**values)


def twin(approval: str) -> Movement:
    return Movement(
        key="k-twin",
        agent_id="7",
        session_id="s-2",
        tool="refund_order",
        subject="ORD-1001",
        amount_cents=6_000,
        at=datetime(2026, 3, 2, 13, 5, tzinfo=UTC),
        approval=approval,
        confirmation_id="c-twin",
    )


def the_sum(
    amount_cents: int = 6_000,
    earlier_cents: int = 0,
    *,
    reviewers_required: int = 1,
    twins: tuple[Movement, ...] = (),
) -> HeldSum:
    return HeldSum(amount_cents, earlier_cents, 0, reviewers_required, twins)


def voted(*reviewers: Reviewer) -> list[CastVote]:
    return [CastVote(reviewer, NOW - timedelta(minutes=5)) for reviewer in reviewers]


def decide(
    call: HeldCall,
    reviewer: Reviewer,
    *,
    votes: Sequence[CastVote] = (),
    customer_sum: HeldSum | None = None,
    rules: Policy | None = None,
    reviewers: Sequence[Reviewer] = TEAM,
    **asked: Any,
) -> Decision:
    return approval_decision(
        call,
        votes,
        reviewer,
        reviewers=reviewers,
        customer_sum=customer_sum if customer_sum is not None else the_sum(call.amount_cents or 0),
        policy=rules if rules is not None else policy(),
        now=NOW,
        money=cents,
        **asked,
    )


def test_one_reviewer_whose_approval_suffices_executes_it() -> None:
    decision = decide(held(), ANA, recheck=lambda _: None)

    assert decision.outcome is Outcome.EXECUTE
    assert decision.needs.yours == "decides"
    assert decision.after.missing_words == []


def test_the_first_of_two_reviewers_records_a_vote_and_says_who_else_is_needed() -> None:
    decision = decide(held(), ANA, customer_sum=the_sum(25_000, reviewers_required=2))

    assert decision.outcome is Outcome.VOTE_RECORDED
    assert decision.needs.yours == "votes"
    assert decision.after.missing == 1
    assert decision.reason == "Needs another reviewer's approval"
    assert decision.after.missing_words == ["1 more reviewer (another than who approved)"]


def test_the_second_of_two_reviewers_executes_it() -> None:
    decision = decide(
        held(), BRUNO, votes=voted(ANA), customer_sum=the_sum(25_000, reviewers_required=2)
    )

    assert decision.outcome is Outcome.EXECUTE
    assert [voter.username for voter in decision.after.voters] == ["ana", "bruno"]


def test_the_customers_sum_of_now_decides_how_many_reviewers_not_the_sum_at_the_hold() -> None:
    call = held(reviewers_required=2)

    decision = decide(call, ANA, customer_sum=the_sum(6_000, reviewers_required=1))

    assert decision.outcome is Outcome.EXECUTE
    assert decision.reviewers_required == 1


def test_without_a_customers_sum_the_count_at_the_hold_and_the_calls_amount_decide() -> None:
    call = held(amount_cents=30_000, reviewers_required=2)
    capped = Reviewer(1, "ana", {"BRL": 10_000})

    decision = approval_decision(
        call,
        (),
        capped,
        reviewers=(capped, BRUNO),
        customer_sum=None,
        policy=policy(),
        now=NOW,
        money=cents,
    )

    assert decision.outcome is Outcome.VOTE_RECORDED
    assert decision.after.missing_words == [
        "1 more reviewer (another than who approved)",
        "a reviewer who may approve 30000 BRL",
    ]


def test_a_second_approval_by_the_same_reviewer_is_refused() -> None:
    decision = decide(held(), ANA, votes=voted(ANA), customer_sum=the_sum(reviewers_required=2))

    assert decision.outcome is Outcome.REFUSED
    assert decision.code == ALREADY_VOTED
    assert decision.reason == "You approved this already; it needs another reviewer's approval."
    assert decision.needs.yours == "voted"


def test_a_call_past_its_expiry_is_refused_with_the_time_it_expired() -> None:
    call = held(expires_at=NOW - timedelta(seconds=1))

    decision = decide(call, ANA)

    assert (decision.outcome, decision.code) == (Outcome.REFUSED, ALREADY_DECIDED)
    assert decision.reason == (
        "It expired at 2026-03-02T14:29:59+00:00; it can no longer be approved."
    )
    assert decision.needs.yours == ""


def test_a_call_decided_already_is_refused_with_when() -> None:
    call = held(status="rejected", decided_at=datetime(2026, 3, 2, 14, 1, 2, tzinfo=UTC))

    decision = decide(call, ANA)

    assert (decision.outcome, decision.code) == (Outcome.REFUSED, ALREADY_DECIDED)
    assert decision.reason == "It is already rejected (decided at 14:01:02)."


def test_the_reason_a_call_can_no_longer_be_rejected_is_the_same() -> None:
    assert closed_reason(held(), NOW) is None
    assert closed_reason(held(status="approved"), NOW) == "It is already approved."
    assert closed_reason(held(expires_at=NOW), NOW) == (
        "It expired at 2026-03-02T14:30:00+00:00; it can no longer be approved."
    )


def test_a_call_held_as_a_possible_duplicate_takes_the_reviewers_word() -> None:
    call = held(held_as_duplicate=True)

    refused = decide(call, ANA)
    separate = decide(call, ANA, separate=True, recheck=lambda _: None)

    assert (refused.outcome, refused.code) == (Outcome.REFUSED, POSSIBLE_DUPLICATE)
    assert refused.reason == (
        "It may repeat money moved by another call. Approve it only if it is a "
        "separate one, with its own approval as such."
    )
    assert refused.asks_separate
    assert separate.outcome is Outcome.EXECUTE


def test_a_twin_approved_elsewhere_makes_it_a_possible_duplicate_naming_the_twin() -> None:
    decision = decide(held(), ANA, customer_sum=the_sum(twins=(twin(APPROVED),)))

    assert decision.code == POSSIBLE_DUPLICATE
    assert decision.reason.startswith(
        "It may repeat refund_order of BRL 60.00 for ORD-1001, approved by another call "
        "at 2026-03-02 13:05 UTC."
    )


def test_a_twin_that_only_waits_too_asks_for_no_word() -> None:
    decision = decide(held(), ANA, customer_sum=the_sum(twins=(twin(HELD),)))

    assert decision.outcome is Outcome.EXECUTE
    assert not decision.asks_separate


def test_an_amount_above_the_second_look_line_takes_a_second_look() -> None:
    rules = policy(confirm_above_cents=5_000)

    refused = decide(held(), ANA, rules=rules, customer_sum=the_sum(6_000, 4_000))
    confirmed = decide(held(), ANA, rules=rules, confirmed=True)

    assert (refused.outcome, refused.code) == (Outcome.REFUSED, SECOND_LOOK_REQUIRED)
    assert refused.reason == (
        "Not approved yet: BRL 60.00 is above BRL 50.00, the amount above which an approval is "
        "confirmed once more; with the customer's other money in the window the sum is "
        "BRL 100.00. Look again and confirm to approve it."
    )
    assert confirmed.outcome is Outcome.EXECUTE


def test_an_amount_at_the_second_look_line_takes_one_click() -> None:
    decision = decide(held(5_000), ANA, rules=policy(confirm_above_cents=5_000))

    assert decision.outcome is Outcome.EXECUTE
    assert not decision.asks_second_look


def test_refusals_come_in_order_voted_then_duplicate_then_second_look() -> None:
    call = held(held_as_duplicate=True)
    rules = policy(confirm_above_cents=1_000)
    two = the_sum(reviewers_required=2)

    assert decide(call, ANA, votes=voted(ANA), rules=rules, customer_sum=two).code == (
        ALREADY_VOTED
    )
    assert decide(call, ANA, rules=rules).code == POSSIBLE_DUPLICATE
    assert decide(call, ANA, rules=rules, separate=True).code == SECOND_LOOK_REQUIRED


def test_an_approver_whose_limit_does_not_cover_the_sum_is_a_vote_naming_who_covers() -> None:
    capped = Reviewer(1, "ana", {"BRL": 5_000})
    team = (capped, Reviewer(2, "bruno", {"BRL": 20_000}), Reviewer(3, "carla", {"BRL": 1_000}))

    decision = decide(held(), capped, reviewers=team, customer_sum=the_sum(6_000, 4_000))

    assert decision.outcome is Outcome.VOTE_RECORDED
    assert decision.needs.your_note == (
        "BRL 100.00 is above your approval limit: yours counts as a vote, and a reviewer whose "
        "limit covers it must approve too."
    )
    assert decision.after.covering == ("bruno",)
    assert decision.reason == (
        "Needs one more approval, from a reviewer whose limit covers BRL 100.00 (bruno)"
    )
    assert decision.after.missing_words == ["a reviewer who may approve 10000 BRL"]


def test_a_limit_equal_to_the_sum_covers_it() -> None:
    exact = Reviewer(1, "ana", {"BRL": 6_000})

    assert decide(held(), exact, recheck=lambda _: None).outcome is Outcome.EXECUTE


def test_a_reviewer_without_a_limit_in_the_currency_has_no_cap_in_it() -> None:
    only_usd = Reviewer(1, "ana", {"USD": 100})
    capped = Reviewer(2, "bruno", {"BRL": 100})

    decision = decide(held(), only_usd, reviewers=(only_usd, capped))

    assert decision.outcome is Outcome.EXECUTE
    assert decision.needs.uncapped_note == "No approval limit in BRL: ana"


def test_an_approval_that_no_longer_passes_its_checks_is_invalidated() -> None:
    gone = Refusal(codes.POLICY_LIMIT, "60.00 is above what the policy allows now.")

    decision = decide(held(), ANA, recheck=lambda _: gone)

    assert decision.outcome is Outcome.INVALIDATED
    assert (decision.code, decision.reason) == (
        "POLICY_LIMIT",
        "60.00 is above what the policy allows now.",
    )
    assert decision.invalidation is gone


def test_a_vote_runs_no_recheck() -> None:
    def recheck(_: Policy) -> Refusal | None:
        raise AssertionError("a vote does not judge the call again")

    decision = decide(held(), ANA, customer_sum=the_sum(reviewers_required=2), recheck=recheck)

    assert decision.outcome is Outcome.VOTE_RECORDED


def test_without_an_active_policy_an_approval_that_suffices_invalidates() -> None:
    decision = approval_decision(
        held(), (), ANA, reviewers=TEAM, customer_sum=None, policy=None, now=NOW, money=cents
    )

    assert decision.outcome is Outcome.INVALIDATED
    assert decision.code == "TOOL_NOT_ALLOWED"
    assert decision.reason == "the agent has no active policy any more"
    assert decision.needs.yours == "invalidates"
    assert decision.needs.your_note == (
        "The agent has no active policy any more: your approval settles it as invalidated, and "
        "nothing executes."
    )
    assert not decision.asks_separate and not decision.asks_second_look


def test_a_page_that_runs_no_recheck_tells_an_approval_that_suffices_as_executing() -> None:
    decision = decide(held(), ANA)

    assert decision.outcome is Outcome.EXECUTE


def test_two_reviewers_to_go_are_told_as_such() -> None:
    decision = decide(held(), ANA, customer_sum=the_sum(reviewers_required=2))

    assert decision.needs.still_needed == "Needs approvals from 2 different reviewers"
    assert decision.needs.your_note == (
        "2 different reviewers must approve: yours is one of them, and another reviewer's "
        "approval executes it."
    )


def test_the_standing_for_no_reader_counts_the_votes_and_names_who_may_cover() -> None:
    capped = Reviewer(1, "ana", {"BRL": 1_000})

    standing = approvals_standing(
        held(),
        voted(capped),
        reviewers=(capped, BRUNO),
        customer_sum=the_sum(6_000, 500, reviewers_required=1),
        money=cents,
    )

    assert standing.yours == ""
    assert standing.missing == 0 and standing.needs_limit
    assert standing.still_needed == (
        "Needs one more approval, from a reviewer whose limit covers BRL 65.00 (bruno)"
    )


def test_a_call_that_moves_no_amount_needs_no_limit() -> None:
    capped = Reviewer(1, "ana", {"BRL": 1})

    decision = approval_decision(
        held(amount_cents=None),
        (),
        capped,
        reviewers=(capped,),
        customer_sum=None,
        policy=policy(),
        now=NOW,
        money=cents,
        recheck=lambda _: None,
    )

    assert decision.outcome is Outcome.EXECUTE
    assert decision.after.missing_words == []


def test_a_twin_moved_without_a_human_is_named_as_executed() -> None:
    decision = decide(held(), ANA, customer_sum=the_sum(twins=(twin(POLICY),)))

    assert "executed by another call" in decision.reason

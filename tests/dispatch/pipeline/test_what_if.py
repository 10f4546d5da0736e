"""A draft policy judged against recorded calls: where each call would have gone, and the money."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    TWO_REVIEWERS,
    DraftError,
    PastCall,
    Tally,
    draft_of,
    policy_replay,
    what_if_of,
)
from tests.dispatch.pipeline.conftest import default_policy


def past(
    minute: int, amount: int, outcome: str, customer: str = "CUS-1", currency: str = "BRL"
) -> PastCall:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC) + timedelta(minutes=minute)
    return PastCall(
        at,
        "agent-1",
        "s-1",
        customer,
        "refund_order",
        f"ORD-{minute}",
        currency,
        amount,
        outcome,
        call_id=f"call-{minute}",
    )


CALLS = [
    past(0, 3_000, AUTO_EXECUTED),
    past(1, 1_500, AUTO_EXECUTED),
    past(2, 6_000, ONE_REVIEWER),
    past(3, 900, AUTO_EXECUTED, customer="CUS-2"),
    past(4, 25_000, TWO_REVIEWERS, customer="CUS-3"),
]


def test_a_replay_judges_past_calls_again_in_their_order() -> None:
    stricter = default_policy(auto_approve_below_cents=4_000)

    verdicts = list(policy_replay(stricter, CALLS))

    # 3000 passes; 1500 would make 4500 in the window, not below 4000; 6000 alone is not below;
    # CUS-2 has nothing earlier; 25000 is held for two from 20000.
    assert [(v.call.call_id, v.outcome, v.reason) for v in verdicts] == [
        ("call-0", AUTO_EXECUTED, ""),
        ("call-1", ONE_REVIEWER, "window_sum"),
        ("call-2", ONE_REVIEWER, "amount"),
        ("call-3", AUTO_EXECUTED, ""),
        ("call-4", TWO_REVIEWERS, "amount"),
    ]


def test_calls_out_of_their_order_are_refused_rather_than_judged_wrongly() -> None:
    replay = policy_replay(default_policy(), reversed(CALLS))

    with pytest.raises(ValueError, match="in the order they arrived"):
        list(replay)


def test_the_what_if_tallies_both_sides_and_the_calls_that_move() -> None:
    looser = default_policy(auto_approve_below_cents=10_000, two_reviewers_from_cents=None)

    result = what_if_of(looser, CALLS)

    assert result.calls == 5
    assert result.actual[AUTO_EXECUTED] == Tally(3, {"BRL": 5_400})
    assert result.actual[ONE_REVIEWER] == Tally(1, {"BRL": 6_000})
    assert result.actual[TWO_REVIEWERS] == Tally(1, {"BRL": 25_000})
    # 3000 + 1500 + 6000 = 10500 is not below 10000: the 6000 stays held, for one reviewer.
    assert result.draft[AUTO_EXECUTED] == Tally(3, {"BRL": 5_400})
    assert result.draft[ONE_REVIEWER] == Tally(2, {"BRL": 31_000})
    assert result.draft[TWO_REVIEWERS] == Tally(0, {})
    assert [(m.actual, m.draft, m.tally) for m in result.moves] == [
        (TWO_REVIEWERS, ONE_REVIEWER, Tally(1, {"BRL": 25_000}))
    ]
    assert [v.call.call_id for v in result.moves[0].examples] == ["call-4"]
    assert result.reasons == {"window_sum": 1, "amount": 1}


def test_a_lower_maximum_refuses_what_it_no_longer_allows() -> None:
    capped = default_policy(max_amount_cents=2_000)

    result = what_if_of(capped, CALLS)

    assert result.draft[REFUSED] == Tally(3, {"BRL": 34_000})
    assert result.draft[AUTO_EXECUTED] == Tally(2, {"BRL": 2_400})
    assert {(m.actual, m.draft): m.tally.calls for m in result.moves} == {
        (AUTO_EXECUTED, REFUSED): 1,
        (ONE_REVIEWER, REFUSED): 1,
        (TWO_REVIEWERS, REFUSED): 1,
    }
    assert result.reasons == {"over_maximum": 3}


def test_money_in_different_currencies_is_never_added_up() -> None:
    calls = [past(0, 1_000, AUTO_EXECUTED), past(1, 2_000, AUTO_EXECUTED, currency="USD")]

    result = what_if_of(default_policy(), calls)

    assert result.draft[AUTO_EXECUTED] == Tally(2, {"BRL": 1_000, "USD": 2_000})
    assert result.moves == ()


def test_the_examples_of_a_move_are_capped() -> None:
    calls = [past(minute, 100, AUTO_EXECUTED, customer=f"C-{minute}") for minute in range(8)]

    result = what_if_of(default_policy(auto_approve_below_cents=0), calls, examples=3)

    assert result.moves[0].tally.calls == 8
    assert len(result.moves[0].examples) == 3


def test_a_draft_out_of_range_names_the_field() -> None:
    policy = default_policy()

    with pytest.raises(DraftError) as error:
        draft_of(policy, {"auto_approve_window_seconds": 5})

    assert error.value.field == "auto_approve_window_seconds"
    assert draft_of(policy, {"two_reviewers_from_cents": None}).two_reviewers_from_cents is None
    assert draft_of(policy, {"max_amount_cents": 7}).max_amount_cents == 7


def test_the_window_s_money_counts_toward_two_reviewers_as_in_the_pipeline() -> None:
    calls = [past(0, 4_000, AUTO_EXECUTED), past(1, 17_000, TWO_REVIEWERS)]

    verdicts = list(policy_replay(default_policy(two_reviewers_from_cents=20_000), calls))

    # 4000 auto-executed, then 17000: alone under 20000, with the window's 4000 it is 21000.
    assert [v.outcome for v in verdicts] == [AUTO_EXECUTED, TWO_REVIEWERS]

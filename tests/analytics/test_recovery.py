"""The recovery rate against small hand-computed fixtures of audit records (docs/analytics.md,
"What each figure means")."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from analytics.recovery import Recovery, recovery_rate
from dispatch.models import Agent, AuditRecord
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 9, tzinfo=UTC)
DAY = (T0, T0 + timedelta(days=1))
_call_ids = itertools.count(1)

# Shorthands for a call's outcome: (ok, code).
OK = (True, "OK")
HELD = (False, "CONFIRMATION_REQUIRED")
INVALID = (False, "INVALID_ARGUMENTS")
NOT_JSON = (False, "INVALID_JSON")
MISMATCH = (False, "CURRENCY_MISMATCH")
POLICY = (False, "POLICY_LIMIT")
LOOP = (False, "LOOP_DETECTED")


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent()[0]


def session(
    agent: Agent,
    calls: list[tuple[str, tuple[bool, str]]],
    *,
    session_id: str = "s-1",
    start: datetime = T0,
) -> None:
    """The calls of one session, one second apart: (tool, outcome) each."""
    for step, (tool, (ok, code)) in enumerate(calls, start=1):
        AuditRecord.objects.create(
            call_id=f"c{next(_call_ids)}",
            at=start + timedelta(seconds=step),
            agent=agent,
            session_id=session_id,
            customer_id="CUS-1",
            step=step,
            tool=tool,
            ok=ok,
            code=code,
            policy_version=1,
            duration_ms=1.0,
        )


def test_it_counts_a_correction_within_the_next_three_calls(agent: Agent) -> None:
    session(
        agent,
        [
            ("refund_order", INVALID),
            ("get_order", OK),
            ("get_order", OK),
            ("refund_order", OK),
        ],
    )

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=1)
    assert rate.overall.rate == 1.0


def test_a_correction_after_three_other_calls_does_not_count(agent: Agent) -> None:
    session(
        agent,
        [
            ("refund_order", INVALID),
            ("get_order", OK),
            ("get_order", OK),
            ("get_order", OK),
            ("refund_order", OK),
        ],
    )

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=0)
    assert rate.overall.rate == 0.0


def test_a_correction_to_another_tool_does_not_count(agent: Agent) -> None:
    session(agent, [("refund_order", INVALID), ("get_order", OK)])

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=0)


def test_a_correction_held_for_confirmation_counts(agent: Agent) -> None:
    session(agent, [("refund_order", INVALID), ("refund_order", HELD)])

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=1)


def test_a_rejection_the_model_cannot_fix_is_not_in_the_denominator(agent: Agent) -> None:
    session(
        agent,
        [
            ("refund_order", POLICY),
            ("refund_order", LOOP),
            ("refund_order", HELD),
            ("refund_order", INVALID),
        ],
    )

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=0)
    assert set(rate.by_code) == {"INVALID_ARGUMENTS"}


def test_a_failed_correction_is_itself_a_rejection_that_may_recover(agent: Agent) -> None:
    session(
        agent,
        [
            ("refund_order", NOT_JSON),
            ("refund_order", INVALID),
            ("refund_order", MISMATCH),
            ("refund_order", OK),
        ],
    )

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=3, recovered=3)


def test_a_call_of_another_session_or_agent_is_no_correction(
    agent: Agent, make_agent: MakeAgent
) -> None:
    other_agent = make_agent()[0]
    session(agent, [("refund_order", INVALID)])
    session(agent, [("refund_order", OK)], session_id="s-2", start=T0 + timedelta(seconds=5))
    # The same session id, under another agent, is another session.
    session(other_agent, [("refund_order", OK)], start=T0 + timedelta(seconds=5))

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(rejected=1, recovered=0)


def test_it_counts_the_rejections_of_the_range_and_their_corrections_after_it(
    agent: Agent,
) -> None:
    # Rejected one second before the range ends, corrected one second after it.
    end = T0 + timedelta(seconds=2)
    session(agent, [("refund_order", INVALID), ("refund_order", INVALID), ("refund_order", OK)])
    session(agent, [("refund_order", INVALID)], session_id="earlier", start=T0 - timedelta(hours=1))

    rate = recovery_rate(start=T0, end=end)

    assert rate.overall == Recovery(rejected=1, recovered=1)


def test_it_gives_the_figures_by_code_by_tool_and_by_both(agent: Agent) -> None:
    session(
        agent,
        [
            ("refund_order", INVALID),
            ("refund_order", OK),
            ("get_order", INVALID),
            ("refund_order", MISMATCH),
            ("refund_order", MISMATCH),
        ],
    )
    session(
        agent,
        [("get_order", INVALID), ("get_order", OK), ("refund_order", INVALID)],
        session_id="s-2",
    )

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.by_code == {
        "CURRENCY_MISMATCH": Recovery(2, 0),
        "INVALID_ARGUMENTS": Recovery(4, 2),
    }
    assert rate.by_tool == {"get_order": Recovery(2, 1), "refund_order": Recovery(4, 1)}
    assert rate.by_tool_and_code == {
        ("get_order", "INVALID_ARGUMENTS"): Recovery(2, 1),
        ("refund_order", "CURRENCY_MISMATCH"): Recovery(2, 0),
        ("refund_order", "INVALID_ARGUMENTS"): Recovery(2, 1),
    }
    assert rate.overall == Recovery(6, 2)
    assert rate.overall.rate == pytest.approx(1 / 3)


def test_it_filters_by_agent_and_by_tool(agent: Agent, make_agent: MakeAgent) -> None:
    other_agent = make_agent()[0]
    session(agent, [("refund_order", INVALID), ("refund_order", OK), ("get_order", INVALID)])
    session(other_agent, [("refund_order", INVALID), ("refund_order", INVALID)])

    mine = recovery_rate(start=DAY[0], end=DAY[1], agent_id=agent.pk)
    refunds = recovery_rate(start=DAY[0], end=DAY[1], tool="refund_order")
    my_reads = recovery_rate(start=DAY[0], end=DAY[1], agent_id=agent.pk, tool="get_order")

    assert mine.overall == Recovery(2, 1)
    assert refunds.overall == Recovery(3, 1)
    assert my_reads.by_tool == {"get_order": Recovery(1, 0)}


def test_it_has_no_rate_when_nothing_fixable_was_rejected(agent: Agent) -> None:
    session(agent, [("refund_order", OK), ("refund_order", POLICY)])

    rate = recovery_rate(start=DAY[0], end=DAY[1])

    assert rate.overall == Recovery(0, 0)
    assert rate.overall.rate is None
    assert rate.by_code == {}

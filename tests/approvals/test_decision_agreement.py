"""What the card tells a reviewer their approval does, and what the service then does, never
disagree: for random held calls, earlier approvals and rejections, reviewers' limits, customer's
sums, expiries and agents switched off, the service's outcome is the one the card explained.

The card's explanation is what the templates render: the status, `approvals.yours` (decides,
votes or voted), whether a possible duplicate asks for the reviewer's word, whether the amount
asks for a second look, and how many more approvals it needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from approvals.models import ReviewerLimit, Vote
from approvals.selectors import ReviewItem, review_items
from approvals.services import (
    ConfirmationError,
    confirmation_approve,
    confirmation_reject,
)
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.pipeline.decision import (
    ALREADY_DECIDED,
    ALREADY_VOTED,
    POSSIBLE_DUPLICATE,
    SECOND_LOOK_REQUIRED,
    Outcome,
)
from dispatch.services import call_dispatch
from tests.conftest import MakeAgent
from tests.factories import OrderFactory

NAMES = ("ana", "bruno", "carla")
EXAMPLES = 150


@dataclass(frozen=True)
class Call:
    amount_cents: int
    order_id: str
    session: str


@dataclass(frozen=True)
class Earlier:
    """A decision made before the one under test: who, on which held call, approve or reject."""

    reviewer: int
    call: int
    approve: bool


calls = st.builds(
    Call,
    amount_cents=st.sampled_from([6_000, 14_000, 26_000]),
    # Mostly one order: the same refund sent from two conversations is a possible duplicate.
    order_id=st.sampled_from(["ORD-3001", "ORD-3001", "ORD-3002"]),
    session=st.sampled_from(["s-1", "s-2", "s-3"]),
)


@dataclass(frozen=True)
class Scenario:
    two_reviewers_from: int | None
    confirm_above: int | None
    # Each reviewer's approval limit in BRL; None: no limit in it.
    limits: list[int | None]
    calls: list[Call]
    # The first refund sent again from another conversation: a possible duplicate.
    sent_again: bool
    earlier: list[Earlier]
    # The reader approved the call under test already.
    reader_approved: bool
    # Which held call the reader approves, and which reviewer reads the card.
    target: int
    reader: int
    # The card's answers: the word that a possible duplicate is a separate one, the second look.
    separate: bool
    confirmed: bool
    hours_later: int
    agent_active: bool


scenarios = st.builds(
    Scenario,
    two_reviewers_from=st.sampled_from([None, 10_000, 10_000, 20_000]),
    confirm_above=st.sampled_from([None, 8_000, 20_000]),
    limits=st.lists(st.sampled_from([None, 5_000, 12_000, 40_000]), min_size=3, max_size=3),
    calls=st.lists(calls, min_size=1, max_size=3),
    sent_again=st.booleans(),
    earlier=st.lists(
        st.builds(
            Earlier,
            reviewer=st.integers(0, 2),
            call=st.integers(0, 3),
            approve=st.sampled_from([True, True, False]),
        ),
        max_size=2,
    ),
    reader_approved=st.sampled_from([False, False, False, True]),
    target=st.integers(0, 3),
    reader=st.integers(0, 2),
    separate=st.booleans(),
    confirmed=st.booleans(),
    # Past the hour a confirmation lives, now and then.
    hours_later=st.sampled_from([0, 0, 0, 0, 0, 2]),
    # Now and then the agent is switched off while its call waits.
    agent_active=st.sampled_from([True, True, True, False]),
)


@pytest.mark.django_db
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios)
def test_the_card_and_the_service_never_disagree_on_an_approval(
    make_agent: MakeAgent, scenario: Scenario
) -> None:
    with transaction.atomic():
        _check(make_agent, scenario)
        # Each example starts from an empty database.
        transaction.set_rollback(True)


def _check(make_agent: MakeAgent, scenario: Scenario) -> None:
    # Arrange: the reviewers and their limits, the orders, the agent's policy, the held calls and
    # what was decided about them before.
    group, _ = Group.objects.get_or_create(name="reviewers")
    people = [User.objects.create_user(name) for name in NAMES]
    for person, limit in zip(people, scenario.limits, strict=True):
        person.groups.add(group)
        if limit is not None:
            ReviewerLimit.objects.create(reviewer=person, currency="BRL", max_amount_cents=limit)
    for order_id in ("ORD-3001", "ORD-3002"):
        OrderFactory.create(order_id=order_id, customer_id="CUS-7", total_cents=90_000)
    agent = make_agent(
        auto_approve_below_cents=5_000,
        two_reviewers_from_cents=scenario.two_reviewers_from,
        confirm_above_cents=scenario.confirm_above,
    )[0]
    sent = list(scenario.calls)
    if scenario.sent_again:
        sent.append(Call(sent[0].amount_cents, sent[0].order_id, "s-9"))
    held = _held(agent, sent)
    for earlier in scenario.earlier:
        _decide_quietly(held[earlier.call % len(held)], people[earlier.reviewer], earlier.approve)
    if not scenario.agent_active:
        Agent.objects.filter(pk=agent.pk).update(is_active=False)
    target = held[scenario.target % len(held)]
    reader = people[scenario.reader]
    if scenario.reader_approved:
        _decide_quietly(target, reader, approve=True)
    now = timezone.now() + timedelta(hours=scenario.hours_later)
    separate, confirmed = scenario.separate, scenario.confirmed
    card = _card(target, reader, now)
    votes_before = Vote.objects.filter(confirmation_id=target).count()

    # Act: the reviewer approves, as the card's form would send it.
    try:
        confirmation_approve(
            confirmation_id=target,
            reviewer=reader,
            now=now,
            separate=separate,
            confirmed=confirmed,
        )
        refused = ""
        message = ""
    except ConfirmationError as exc:
        refused, message = exc.code, exc.message
    status = Confirmation.objects.values_list("status", flat=True).get(pk=target)
    event(f"refused {refused}" if refused else f"{card.approvals.yours}, then {status}")

    # Assert: what the card said the approval would do is what it did.
    expected = _refusal_on_the_card(card, separate=separate, confirmed=confirmed)
    assert refused == expected, (card.status, card.approvals, card.decision)
    votes_after = Vote.objects.filter(confirmation_id=target).count()
    if refused:
        assert votes_after == votes_before, "a refused approval records nothing"
        if refused in (ALREADY_DECIDED, ALREADY_VOTED):
            assert card.decision is not None and message == card.decision.reason
        return
    assert votes_after == votes_before + 1
    if card.approvals.yours == "invalidates":
        # The agent was switched off: the card says nothing will execute.
        assert status == ConfirmationStatus.INVALIDATED
        return
    if card.approvals.yours == "decides":
        assert card.decision is not None and card.decision.outcome is Outcome.EXECUTE
        # The card cannot foresee the re-check of the live state (the order changed meanwhile).
        assert status in (ConfirmationStatus.APPROVED, ConfirmationStatus.INVALIDATED)
        return
    assert card.approvals.yours == "votes"
    assert status == ConfirmationStatus.PENDING
    after = _card(target, reader, now)
    assert after.approvals.yours == "voted"
    assert after.approvals.missing == max(0, card.approvals.missing - 1)
    assert card.decision is not None
    assert after.approvals.still_needed == card.decision.after.still_needed
    assert after.approvals.still_needed, "a vote that does not decide says what is still needed"


def _refusal_on_the_card(card: ReviewItem, *, separate: bool, confirmed: bool) -> str:
    """The refusal the card announces for an approval with these answers; "" for none."""
    if card.status != ConfirmationStatus.PENDING:
        return ALREADY_DECIDED
    if card.approvals.yours == "voted":
        return ALREADY_VOTED
    if card.duplicate is not None and card.duplicate.needs_word and not separate:
        return POSSIBLE_DUPLICATE
    if card.second_look is not None and not confirmed:
        return SECOND_LOOK_REQUIRED
    return ""


def _card(confirmation_id: str, reader: User, now: datetime) -> ReviewItem:
    confirmation = Confirmation.objects.select_related("agent__current_policy").get(
        pk=confirmation_id
    )
    return review_items([confirmation], reader=reader, now=now)[0]


def _held(agent: Agent, sent: list[Call]) -> list[str]:
    """The ids of the calls the agent's policy held (an identical call in one session is one)."""
    held: list[str] = []
    for call in sent:
        result = call_dispatch(
            agent=agent,
            session_id=call.session,
            customer_id="CUS-7",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": call.order_id,
                    "amount_cents": call.amount_cents,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )
        confirmation_id = (result.data or {}).get("confirmation_id")
        if confirmation_id and confirmation_id not in held:
            held.append(confirmation_id)
    assert held, "every call here is held: each is above what may move without a human"
    return held


def _decide_quietly(confirmation_id: str, reviewer: User, approve: bool) -> None:
    try:
        if approve:
            confirmation_approve(
                confirmation_id=confirmation_id, reviewer=reviewer, separate=True, confirmed=True
            )
        else:
            confirmation_reject(confirmation_id=confirmation_id, reviewer=reviewer, reason="no")
    except ConfirmationError:
        pass  # decided already, or voted already: the scenario goes on from there

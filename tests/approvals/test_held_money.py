"""Money held for a human is guarded as money moved without one: the customer's sum counts what is
held, an approval judges the reviewers and the approver's limit on the sum of its moment, and an
identical refund resent from another conversation is paid once unless a reviewer says it is a
separate one.

The races run on PostgreSQL with real connections: reviewers and agents in threads of their own,
each on its own connection, under a lock timeout that turns a deadlock into a failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import requests
from django.contrib.auth.models import Group, User
from django.db import connection, connections
from django.test import Client
from django.urls import reverse
from pytest_django.live_server_helper import LiveServer

from approvals.models import ConfirmationEvent, EventKind, ReviewerLimit
from approvals.reviewers import reviewer_token_create
from approvals.services import (
    AlreadyVoted,
    PossibleDuplicate,
    confirmation_approve,
    confirmation_reject,
)
from dispatch.models import Agent, Confirmation, ConfirmationStatus, Movement
from dispatch.services import call_dispatch
from orders.models import Order, Refund
from tests.conftest import MakeAgent
from tests.factories import OrderFactory
from toolgate_client import Toolgate

CUSTOMER = "CUS-8"

# Decisions commit for real, and an approved refund executes after its commit, as in production
# with the embedded in-process worker.
pytestmark = pytest.mark.django_db(transaction=True)


def refund(
    agent: Agent, order_id: str, amount_cents: int, *, session: str, reason: str = "damaged"
) -> dict[str, Any]:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id=CUSTOMER,
        tool="refund_order",
        arguments={
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": "BRL",
            "reason": reason,
        },
    ).as_dict()


def held(result: dict[str, Any]) -> Confirmation:
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result["data"]["confirmation_id"])


def status(confirmation: Confirmation) -> str:
    return str(Confirmation.objects.values_list("status", flat=True).get(pk=confirmation.pk))


def refunded() -> int:
    return sum(
        Refund.objects.filter(order__customer_id=CUSTOMER).values_list("amount_cents", flat=True)
    )


@pytest.fixture
def orders(db: None) -> list[Order]:
    return [
        OrderFactory.create(order_id=f"ORD-80{n}", customer_id=CUSTOMER, total_cents=90_000)
        for n in range(6)
    ]


@pytest.fixture
def people(db: None) -> list[User]:
    group, _ = Group.objects.get_or_create(name="reviewers")
    team = [
        User.objects.create_user(name, password="pw") for name in ("ana", "bea", "caio", "dani")
    ]
    for person in team:
        person.groups.add(group)
    return team


# The sum decides the reviewers ---------------------------------------------------------------


def test_one_reviewer_cannot_move_two_held_refunds_past_the_two_reviewer_line(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    first = held(refund(agent, orders[0].order_id, 6_000, session="s-1"))
    second = held(refund(agent, orders[1].order_id, 6_000, session="s-2"))
    ana = people[0]

    after_first = confirmation_approve(confirmation_id=first.pk, reviewer=ana)
    after_second = confirmation_approve(confirmation_id=second.pk, reviewer=ana)

    assert (first.reviewers_required, second.reviewers_required) == (1, 2)
    # With R$ 60,00 held for the customer, each makes a sum of R$ 120,00: two reviewers.
    assert after_first.status == after_second.status == ConfirmationStatus.PENDING
    assert after_first.reviewers_required == after_second.reviewers_required == 2
    assert refunded() == 0
    voted = ConfirmationEvent.objects.get(confirmation=first, kind=EventKind.VOTED)
    assert voted.data["sum_cents"] == 12_000
    assert voted.data["held_cents"] == 6_000


def test_a_second_reviewer_approves_each_and_both_execute(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    first = held(refund(agent, orders[0].order_id, 6_000, session="s-1"))
    second = held(refund(agent, orders[1].order_id, 6_000, session="s-2"))
    for confirmation in (first, second):
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=people[0])

    for confirmation in (first, second):
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=people[1])
    outcomes = [status(first), status(second)]

    assert outcomes == [ConfirmationStatus.EXECUTED, ConfirmationStatus.EXECUTED]
    assert refunded() == 12_000
    # Executed, each is one row of money moved with a reviewer, under the key it was held under.
    assert sorted(Movement.objects.values_list("key", "approval")) == sorted(
        [(first.execution_key, "reviewer"), (second.execution_key, "reviewer")]
    )


def test_five_held_refunds_cannot_pass_an_approvers_limit_of_twice_one_of_them(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=None)[0]
    holds = [
        held(refund(agent, order.order_id, 10_000 + n, session=f"s-{n}"))
        for n, order in enumerate(orders[:5])
    ]
    ana = people[0]
    ReviewerLimit.objects.create(reviewer=ana, currency="BRL", max_amount_cents=20_000)

    outcomes = [
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=ana).status
        for confirmation in holds
    ]

    assert outcomes == [ConfirmationStatus.PENDING] * 5
    assert refunded() == 0


def test_once_the_others_are_rejected_the_limit_covers_the_sum_again(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=None)[0]
    holds = [
        held(refund(agent, order.order_id, 10_000, session=f"s-{n}"))
        for n, order in enumerate(orders[:5])
    ]
    ana, bea = people[:2]
    ReviewerLimit.objects.create(reviewer=ana, currency="BRL", max_amount_cents=20_000)
    for confirmation in holds[2:]:
        confirmation_reject(confirmation_id=confirmation.pk, reviewer=bea, reason="not eligible")

    for confirmation in holds[:2]:
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=ana)
    outcomes = [status(confirmation) for confirmation in holds[:2]]

    assert outcomes == [ConfirmationStatus.EXECUTED, ConfirmationStatus.EXECUTED]
    assert refunded() == 20_000


def test_money_held_counts_until_its_expiry_and_then_no_longer(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    first = held(refund(agent, orders[0].order_id, 6_000, session="s-1"))
    second = held(refund(agent, orders[1].order_id, 6_000, session="s-2"))
    # The first's expiry passed (it was held long ago); the beat has not marked it yet.
    Confirmation.objects.filter(pk=first.pk).update(expires_at=first.created_at)
    Movement.objects.filter(key=first.execution_key).update(expires_at=first.created_at)

    confirmation_approve(confirmation_id=second.pk, reviewer=people[0])

    assert status(first) == ConfirmationStatus.PENDING
    assert status(second) == ConfirmationStatus.EXECUTED
    assert refunded() == 6_000


# One logical refund, one payment ----------------------------------------------------------------


def test_an_identical_held_refund_resent_from_three_sessions_and_each_approved_is_paid_once(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    resends = [refund(agent, orders[0].order_id, 3_000, session=f"restart-{n}") for n in range(3)]
    holds = [held(result) for result in resends]

    outcomes: list[str] = []
    for confirmation, reviewer in zip(holds, people, strict=False):
        try:
            confirmation_approve(confirmation_id=confirmation.pk, reviewer=reviewer)
        except PossibleDuplicate:
            outcomes.append("refused: possible duplicate")
        else:
            outcomes.append(status(confirmation))

    assert [result["data"]["reason"]["kind"] for result in resends] == [
        "amount",
        "possible_duplicate",
        "possible_duplicate",
    ]
    assert holds[1].duplicate_of == holds[2].duplicate_of == holds[0].execution_key
    assert outcomes == [ConfirmationStatus.EXECUTED] + ["refused: possible duplicate"] * 2
    assert refunded() == 3_000
    assert Refund.objects.count() == 1


def test_the_model_is_told_it_may_repeat_a_refund_without_the_other_sessions_ids(
    make_agent: MakeAgent, orders: list[Order]
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    other = make_agent(auto_approve_below_cents=1_000)[0]
    refund(agent, orders[0].order_id, 3_000, session="private-session-7")

    again = refund(other, orders[0].order_id, 3_000, session="s-2")

    assert again["data"]["reason"]["kind"] == "possible_duplicate"
    assert "may repeat" in again["message"] and orders[0].order_id in again["message"]
    assert "private-session-7" not in repr(again)
    assert agent.name not in repr(again)


def test_a_reviewer_pays_a_possible_duplicate_only_by_saying_it_is_a_separate_one(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    first = held(refund(agent, orders[0].order_id, 3_000, session="s-1"))
    twin = held(refund(agent, orders[0].order_id, 3_000, session="s-2"))
    confirmation_approve(confirmation_id=first.pk, reviewer=people[0])

    with pytest.raises(PossibleDuplicate):
        confirmation_approve(confirmation_id=twin.pk, reviewer=people[1])
    confirmation_approve(confirmation_id=twin.pk, reviewer=people[1], separate=True)

    assert status(twin) == ConfirmationStatus.EXECUTED
    assert refunded() == 6_000
    kinds = list(
        ConfirmationEvent.objects.filter(confirmation=twin).values_list("kind", "actor_label")
    )
    assert kinds[:2] == [(EventKind.SEPARATE, "bea"), (EventKind.VOTED, "bea")]


def test_a_refund_sent_again_after_its_twin_was_rejected_is_still_a_possible_duplicate(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    first = held(refund(agent, orders[0].order_id, 3_000, session="s-1"))
    twin = held(refund(agent, orders[0].order_id, 3_000, session="s-2"))
    confirmation_reject(confirmation_id=first.pk, reviewer=people[0], reason="already paid")

    with pytest.raises(PossibleDuplicate):
        confirmation_approve(confirmation_id=twin.pk, reviewer=people[1])

    assert refunded() == 0


# Races, on PostgreSQL ----------------------------------------------------------------------------


def on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent connections take turns on SQLite's one write lock")


def all_at_once(work: list[Callable[[], object]], timeout: float = 60.0) -> list[object]:
    """Run each piece of work in a thread of its own, on its own connection, released together;
    what each returned or raised."""
    barrier = threading.Barrier(len(work))
    outcomes: list[object] = [None] * len(work)

    def run(index: int) -> None:
        try:
            with connection.cursor() as cursor:
                # A deadlock between decisions and calls would wait here for ever: make it fail.
                cursor.execute("SET lock_timeout = '10s'")
            barrier.wait()
            outcomes[index] = work[index]()
        except BaseException as exc:
            outcomes[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck: a deadlock"
    return outcomes


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_reviewers_and_agents_at_once_on_one_customer_neither_deadlock_nor_pass_the_line(
    make_agent: MakeAgent, orders: list[Order], people: list[User], attempt: int
) -> None:
    on_postgresql()
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    holds = [
        held(refund(agent, order.order_id, 6_000 + n, session=f"s-{n}"))
        for n, order in enumerate(orders[:4])
    ]

    def approve(confirmation: Confirmation, reviewer: User) -> Callable[[], object]:
        return lambda: confirmation_approve(confirmation_id=confirmation.pk, reviewer=reviewer)

    def call(n: int) -> Callable[[], object]:
        return lambda: refund(agent, orders[4 + n % 2].order_id, 100 + n, session=f"late-{n}")

    outcomes = all_at_once(
        [approve(confirmation, people[n]) for n, confirmation in enumerate(holds)]
        + [call(n) for n in range(6)]
    )

    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert errors == []
    # Every held refund makes a sum of more than 100.00 with the others: one reviewer is a vote.
    assert [Confirmation.objects.get(pk=confirmation.pk).status for confirmation in holds] == [
        ConfirmationStatus.PENDING
    ] * 4
    assert all(
        isinstance(outcome, dict) and outcome["code"] == "CONFIRMATION_REQUIRED"
        for outcome in outcomes[4:]
    )
    assert refunded() == 0


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_two_twins_approved_at_the_same_moment_pay_once(
    make_agent: MakeAgent, orders: list[Order], people: list[User], attempt: int
) -> None:
    on_postgresql()
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    first = held(refund(agent, orders[0].order_id, 3_000, session="s-1"))
    twin = held(refund(agent, orders[0].order_id, 3_000, session="s-2"))

    outcomes = all_at_once(
        [
            lambda: confirmation_approve(confirmation_id=first.pk, reviewer=people[0]),
            lambda: confirmation_approve(confirmation_id=twin.pk, reviewer=people[1]),
        ]
    )

    assert isinstance(outcomes[0], Confirmation)
    assert isinstance(outcomes[1], PossibleDuplicate)
    assert refunded() == 3_000


def test_of_three_twins_approved_at_once_only_the_first_approved_and_a_separate_one_pay(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    on_postgresql()
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    twins = [held(refund(agent, orders[0].order_id, 3_000, session=f"s-{n}")) for n in range(3)]

    outcomes = all_at_once(
        [
            lambda: confirmation_approve(confirmation_id=twins[0].pk, reviewer=people[0]),
            lambda: confirmation_approve(confirmation_id=twins[1].pk, reviewer=people[1]),
            lambda: confirmation_approve(
                confirmation_id=twins[2].pk, reviewer=people[2], separate=True
            ),
        ]
    )

    # The second was held as a duplicate: refused without the word. The first is refused too if
    # the separate one was approved before it: decisions of one customer take turns.
    paid = [not isinstance(outcome, BaseException) for outcome in outcomes]
    assert isinstance(outcomes[1], PossibleDuplicate)
    assert paid[2]
    assert refunded() == 3_000 * sum(paid)
    assert Refund.objects.count() == sum(paid)


def test_a_second_vote_by_the_same_reviewer_is_still_refused(
    make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    first = held(refund(agent, orders[0].order_id, 6_000, session="s-1"))
    held(refund(agent, orders[1].order_id, 6_000, session="s-2"))
    confirmation_approve(confirmation_id=first.pk, reviewer=people[0])

    with pytest.raises(AlreadyVoted):
        confirmation_approve(confirmation_id=first.pk, reviewer=people[0])

    assert refunded() == 0


# Black-box, over HTTP ----------------------------------------------------------------------------


def test_over_http_one_reviewer_cannot_move_two_held_60s_past_a_100_line(
    live_server: LiveServer, make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    _, token = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)
    agent_host = Toolgate(live_server.url, token, customer_id=CUSTOMER, session_id="chat-1")
    held_ids = [
        agent_host.call(
            "refund_order",
            {
                "order_id": order.order_id,
                "amount_cents": 6_000,
                "currency": "BRL",
                "reason": "damaged",
            },
        ).confirmation_id
        for order in orders[:2]
    ]
    ana, bea = (reviewer_token_create(user=person) for person in people[:2])

    def approve(confirmation_id: str | None, reviewer_token: str, **body: Any) -> Any:
        return requests.post(
            f"{live_server.url}/api/v1/confirmations/{confirmation_id}/approve",
            json=body or None,
            headers={"Authorization": f"Token {reviewer_token}"},
            timeout=30,
        )

    by_one = [approve(confirmation_id, ana) for confirmation_id in held_ids]
    moved_by_one = refunded()
    by_two = [approve(confirmation_id, bea) for confirmation_id in held_ids]

    assert [response.status_code for response in by_one] == [200, 200]
    assert [response.json()["status"] for response in by_one] == ["pending", "pending"]
    assert [response.json()["reviewers_required"] for response in by_one] == [2, 2]
    assert moved_by_one == 0
    assert [response.json()["status"] for response in by_two] == ["executed", "executed"]
    assert refunded() == 12_000


def test_over_http_a_possible_duplicate_is_a_409_until_the_reviewer_says_separate(
    live_server: LiveServer, make_agent: MakeAgent, orders: list[Order], people: list[User]
) -> None:
    _, token = make_agent(auto_approve_below_cents=1_000)
    arguments = {
        "order_id": orders[0].order_id,
        "amount_cents": 3_000,
        "currency": "BRL",
        "reason": "damaged",
    }
    first, again = (
        Toolgate(live_server.url, token, customer_id=CUSTOMER, session_id=session).call(
            "refund_order", arguments
        )
        for session in ("before-restart", "after-restart")
    )
    reviewer = reviewer_token_create(user=people[0])
    url = f"{live_server.url}/api/v1/confirmations/{{}}/approve"
    headers = {"Authorization": f"Token {reviewer}"}

    approved = requests.post(url.format(first.confirmation_id), headers=headers, timeout=30)
    refused = requests.post(url.format(again.confirmation_id), headers=headers, timeout=30)
    moved_before = refunded()
    separate = requests.post(
        url.format(again.confirmation_id), json={"separate": True}, headers=headers, timeout=30
    )

    assert approved.json()["status"] == "executed"
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "possible_duplicate"
    assert moved_before == 3_000
    assert separate.json()["status"] == "executed"
    assert refunded() == 6_000


# What the reviewer reads -----------------------------------------------------------------------


def test_the_card_says_the_customers_sum_and_the_reviewers_it_needs(
    make_agent: MakeAgent, orders: list[Order], people: list[User], client: Client
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=10_000)[0]
    held(refund(agent, orders[0].order_id, 6_000, session="s-1"))
    second = held(refund(agent, orders[1].order_id, 6_000, session="s-2"))
    client.force_login(people[0])

    page = client.get(reverse("approvals:detail", args=[second.pk])).content.decode()

    assert (
        "With R$\xa060,00 already held for this customer in the last 24 hours, the sum is "
        "R$\xa0120,00: two reviewers." in page
    )


def test_a_possible_duplicate_offers_only_the_deliberate_approval(
    make_agent: MakeAgent, orders: list[Order], people: list[User], client: Client
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    first = held(refund(agent, orders[0].order_id, 3_000, session="s-1"))
    twin = held(refund(agent, orders[0].order_id, 3_000, session="s-2"))
    client.force_login(people[0])

    first_page = client.get(reverse("approvals:detail", args=[first.pk])).content.decode()
    twin_page = client.get(reverse("approvals:detail", args=[twin.pk])).content.decode()
    plain = client.post(reverse("approvals:approve", args=[twin.pk]), follow=True)

    assert 'class="approve"' in first_page and "Sent again elsewhere" in first_page
    assert 'class="approve"' not in twin_page
    assert 'name="separate" value="yes"' in twin_page
    assert reverse("approvals:detail", args=[first.pk]) in twin_page
    assert "It may repeat" in plain.content.decode()
    assert status(twin) == ConfirmationStatus.PENDING
    assert refunded() == 0

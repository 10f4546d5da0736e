"""The card shows the customer: the money the policy counts with a held call (the very sum an
approval judges), the order's date, why one reviewer or two; and an approval above the policy's
second-look amount asks once more, in the page and on the server."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from approvals import selectors
from approvals.models import Vote
from dispatch.held_money import held_money_sum
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.services import call_dispatch
from orders.models import Order, Refund
from tests.conftest import MakeAgent, Run
from tests.factories import OrderFactory

CUSTOMER = "CUS-44"

pytestmark = pytest.mark.django_db(transaction=True)


def refund(agent: Agent, order_id: str, amount_cents: int, *, session: str) -> dict[str, Any]:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id=CUSTOMER,
        tool="refund_order",
        arguments={
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": "BRL",
            "reason": "damaged",
        },
    ).as_dict()


def held(result: dict[str, Any]) -> Confirmation:
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result["data"]["confirmation_id"])


def text(html: bytes) -> str:
    """The page's words, tags left out and spaces folded (as a reader reads them)."""
    words = unescape(re.sub(r"<[^>]+>", " ", html.decode()))
    return " ".join(words.replace("\xa0", " ").split())


@pytest.fixture
def orders(db: None) -> list[Order]:
    return [
        OrderFactory.create(order_id=f"ORD-44{n}", customer_id=CUSTOMER, total_cents=90_000)
        for n in (1, 2)
    ]


@pytest.fixture
def reviewer(db: None, client: Client) -> User:
    group, _ = Group.objects.get_or_create(name="reviewers")
    person = User.objects.create_user("rita", password="pw")
    person.groups.add(group)
    client.force_login(person)
    return person


def test_two_pending_refunds_of_one_order_mention_each_other_with_the_judged_sum(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(auto_approve_below_cents=2_000, two_reviewers_from_cents=30_000)[0]
    first = held(refund(agent, "ORD-441", 2_500, session="s-1"))
    second = held(refund(agent, "ORD-441", 3_000, session="s-2"))

    pages = {c.pk: client.get(reverse("approvals:detail", args=[c.pk])) for c in (first, second)}

    for this, other in ((first, second), (second, first)):
        html = pages[this.pk].content.decode()
        # The other one is on the card, marked as the same order, with a link to its own card.
        assert reverse("approvals:detail", args=[other.pk]) in html
        assert "1 other on the same order waiting too" in text(pages[this.pk].content)
        assert "same order" in text(pages[this.pk].content)
    # The sum shown is the one an approval judges: R$ 55,00 on both cards.
    policy = agent.current_policy
    assert policy is not None
    for confirmation in (first, second):
        judged = held_money_sum(confirmation=confirmation, policy=policy.snapshot())
        assert judged is not None and judged.sum_cents == 5_500
        words = text(pages[confirmation.pk].content)
        assert "R$ 55,00 the sum, with this" in words
        assert (
            "That sum, R$ 55,00, is not below R$ 20,00, the most that may move without a human"
            in (words)
        )


def test_the_card_lists_moved_and_held_money_in_the_window_and_the_order_date(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=30_000)[0]
    assert refund(agent, "ORD-442", 1_000, session="s-1")["ok"]
    held_one = held(refund(agent, "ORD-441", 6_000, session="s-2"))

    words = text(client.get(reverse("approvals:detail", args=[held_one.pk])).content)

    assert "This customer in the last 24 hours" in words
    assert "R$ 10,00 Refund order · ORD-442 without a human" in words
    assert "R$ 10,00 already moved or on its way" in words
    assert "R$ 70,00 the sum, with this R$ 60,00" in words
    # The order's date, from the tool's declared review.
    assert "Ordered" in words
    assert Refund.objects.count() == 1


@pytest.mark.parametrize(
    ("amount_cents", "rule"),
    [
        (
            6_000,
            "One reviewer: the customer's sum, R$ 60,00, is below R$ 300,00, from which this "
            "agent's policy asks for two.",
        ),
        (
            31_000,
            "Two different reviewers: the customer's sum, R$ 310,00, is not below R$ 300,00, "
            "from which this agent's policy asks for two.",
        ),
    ],
)
def test_the_card_says_why_one_reviewer_or_two_with_the_policys_amounts(
    make_agent: MakeAgent,
    orders: list[Order],
    reviewer: User,
    client: Client,
    amount_cents: int,
    rule: str,
) -> None:
    agent = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=30_000)[0]
    confirmation = held(refund(agent, "ORD-441", amount_cents, session="s-1"))

    words = text(client.get(reverse("approvals:detail", args=[confirmation.pk])).content)

    assert rule in words
    assert "Nothing else for this customer in the last 24 hours" in words


# A second look above the policy's amount -----------------------------------------------------


def test_an_approval_above_the_amount_without_the_second_look_is_refused_and_records_nothing(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=20_000
    )[0]
    assert refund(agent, "ORD-442", 500, session="s-0")["ok"]
    confirmation = held(refund(agent, "ORD-441", 25_000, session="s-1"))
    url = reverse("approvals:approve", args=[confirmation.pk])

    refused = client.post(url, {"next": reverse("approvals:queue")})

    assert refused.status_code == 400
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert not Vote.objects.filter(confirmation=confirmation).exists()
    words = text(refused.content)
    assert "R$ 250,00 is above R$ 200,00" in words
    assert "the sum is R$ 255,00" in words
    # The page asks once more, open, with a form that sends the confirmation.
    html = refused.content.decode()
    assert re.search(r'<dialog class="second-look" id="second-look-[0-9a-f]+"[^>]* open>', html)
    assert 'name="confirmed" value="yes"' in html
    assert "Yes, approve R$\xa0250,00" in html

    approved = client.post(url, {"next": reverse("approvals:queue"), "confirmed": "yes"})

    assert approved.status_code == 303
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(amount_cents=25_000).count() == 1


def test_an_approval_at_or_below_the_amount_is_one_click(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=20_000
    )[0]
    confirmation = held(refund(agent, "ORD-441", 20_000, session="s-1"))

    page = client.get(reverse("approvals:queue")).content.decode()
    response = client.post(reverse("approvals:approve", args=[confirmation.pk]))

    assert "second-look" not in page
    assert response.status_code == 303
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.EXECUTED


def test_the_queue_offers_the_second_look_in_the_page_above_the_amount(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=20_000
    )[0]
    confirmation = held(refund(agent, "ORD-441", 20_001, session="s-1"))

    html = client.get(reverse("approvals:queue")).content.decode()

    assert f'data-second-look="second-look-{confirmation.pk}"' in html
    assert f'<dialog class="second-look" id="second-look-{confirmation.pk}"' in html
    # Closed until the reader approves.
    assert not re.search(r'<dialog class="second-look"[^>]* open>', html)


def test_the_reviewer_api_asks_for_the_second_look_too(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=20_000
    )[0]
    confirmation = held(refund(agent, "ORD-441", 30_000, session="s-1"))
    url = f"/api/v1/confirmations/{confirmation.pk}/approve"
    csrf = Client(enforce_csrf_checks=False)
    csrf.force_login(reviewer)

    refused = csrf.post(url, {}, content_type="application/json")
    approved = csrf.post(url, {"confirmed": True}, content_type="application/json")

    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "confirmation_required"
    assert "R$\xa0300,00 is above R$\xa0200,00" in refused.json()["error"]["message"]
    assert approved.status_code == 200
    assert approved.json()["status"] == "executed"


def test_a_policy_names_no_second_look_by_default(make_agent: MakeAgent) -> None:
    agent = make_agent()[0]
    assert agent.current_policy is not None
    policy = agent.current_policy.snapshot()

    assert policy.confirm_above("BRL") is None
    assert not policy.needs_second_look(10**8, "BRL")


def test_create_agent_takes_the_second_look_amount_per_currency(run: Run) -> None:
    run(
        "create_agent",
        "careful",
        "--tools",
        "refund_order",
        "--confirm-above",
        "BRL:200",
        "JPY:20000",
        "--max-amount",
        "BRL:500",
        "JPY:50000",
    )

    policy = Agent.objects.get(name="careful").current_policy
    assert policy is not None
    limits = policy.limits()
    assert limits is not None
    assert limits["BRL"].confirm_above_cents == 20_000
    assert limits["JPY"].confirm_above_cents == 20_000


# The tab's count ----------------------------------------------------------------------------


def test_the_tabs_title_counts_what_the_badge_counts(
    make_agent: MakeAgent,
    orders: list[Order],
    reviewer: User,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = make_agent(auto_approve_below_cents=1_000)[0]
    held(refund(agent, "ORD-441", 2_000, session="s-1"))
    held(refund(agent, "ORD-442", 3_000, session="s-2"))
    # The page shows fewer than are waiting.
    monkeypatch.setattr(selectors, "QUEUE_SHOWN", 1)

    html = client.get(reverse("approvals:queue")).content.decode()

    title = re.search(r"<title>(.*?)</title>", html, re.S)
    assert title is not None and "Approvals (2)" in title.group(1)
    badge = re.search(r'id="nav-pending-count"[^>]*>(\d+)<', html)
    assert badge is not None and badge.group(1) == "2"
    assert 'data-pending-total="2"' in html


def test_a_possible_duplicate_above_the_amount_keeps_its_word_through_the_second_look(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=20_000
    )[0]
    first = held(refund(agent, "ORD-441", 25_000, session="s-1"))
    assert (
        client.post(reverse("approvals:approve", args=[first.pk]), {"confirmed": "yes"}).status_code
        == 303
    )
    again = held(refund(agent, "ORD-441", 25_000, session="s-2"))
    url = reverse("approvals:approve", args=[again.pk])

    asked = client.post(url, {"separate": "yes", "checked": "on"})

    assert asked.status_code == 400
    # The second look carries the reviewer's word that it is a separate one.
    html = asked.content.decode()
    dialog = html[html.index('<dialog class="second-look"') :]
    assert 'name="separate" value="yes"' in dialog[: dialog.index("</dialog>")]
    approved = client.post(url, {"separate": "yes", "confirmed": "yes"})
    assert approved.status_code == 303
    again.refresh_from_db()
    assert again.status == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(amount_cents=25_000).count() == 2


def test_the_card_of_a_switched_off_agents_call_says_an_approval_executes_nothing(
    make_agent: MakeAgent, orders: list[Order], reviewer: User, client: Client
) -> None:
    agent = make_agent(auto_approve_below_cents=2_000, confirm_above_cents=1_000)[0]
    waiting = held(refund(agent, "ORD-441", 2_500, session="s-1"))
    Agent.objects.filter(pk=agent.pk).update(is_active=False)

    page = text(client.get(reverse("approvals:detail", args=[waiting.pk])).content)
    approved = client.post(reverse("approvals:approve", args=[waiting.pk]))

    # As the approval judges it: no policy, so no second look, and nothing executes.
    assert "your approval settles it as invalidated, and nothing executes" in page
    assert "Your approval executes it" not in page
    assert approved.status_code == 303
    waiting.refresh_from_db()
    assert waiting.status == ConfirmationStatus.INVALIDATED
    assert not Refund.objects.exists()

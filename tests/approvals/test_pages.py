"""The reviewer pages, through Django's test client: who may open them, what they show."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from pytest_django.fixtures import Settings

from approvals.models import ReviewerLimit
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch
from tests.approvals.conftest import HELD_ACTIONS, HoldRefund, MakeUser
from tests.conftest import MakeAgent, confirmation_rewrite
from tests.factories import OrderFactory

pytestmark = pytest.mark.django_db

PAGES = ("/approvals/", "/approvals/history/", "/approvals/reconciliation/")


def text(response: object) -> str:
    """The page's text with tags removed and white space collapsed, as a reader sees it."""
    content = response.content.decode()  # type: ignore[attr-defined]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", content)))


@pytest.mark.parametrize("path", PAGES)
def test_it_sends_an_anonymous_visitor_to_the_login(client: Client, path: str) -> None:
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_it_refuses_a_user_outside_the_reviewers_group(
    client: Client, manager: User, path: str
) -> None:
    client.force_login(manager)

    response = client.get(path)

    assert response.status_code == 403
    assert "for reviewers" in text(response)


def test_it_refuses_a_decision_from_a_user_outside_the_reviewers_group(
    client: Client, manager: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    client.force_login(manager)

    response = client.post(f"/approvals/{held.pk}/reject", {"reason": "no"})

    assert response.status_code == 403
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING


def test_the_queue_shows_a_held_refund_with_its_order_in_the_orders_currency(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    hold_refund(6_000, order_id="ORD-1001")
    client.force_login(reviewer)

    page = text(client.get("/approvals/"))

    assert "R$ 60,00" in page
    assert "ORD-1001" in page and "CUS-1" in page
    assert "Order total R$ 120,00" in page
    assert "Already refunded R$ 0,00" in page
    assert "Still refundable R$ 120,00" in page
    assert "damaged" in page
    assert "R$ 60,00 is not below R$ 50,00" in page


def test_the_queue_formats_dollars_the_american_way(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    OrderFactory.create(
        order_id="ORD-3001", customer_id="CUS-2", total_cents=20_000, currency="USD"
    )
    hold_refund(
        5_500, order_id="ORD-3001", currency="USD", customer_id="CUS-2", reason="not_delivered"
    )
    client.force_login(reviewer)

    page = text(client.get("/approvals/"))

    assert "$55.00" in page and "Order total $200.00" in page
    assert "not delivered" in page


def test_the_queue_puts_the_soonest_expiry_first(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    later = hold_refund(6_000)
    sooner = hold_refund(7_000)
    Confirmation.objects.filter(pk=sooner.pk).update(
        expires_at=timezone.now() + timedelta(minutes=5)
    )
    client.force_login(reviewer)

    content = client.get("/approvals/").content.decode()

    assert content.index(sooner.pk) < content.index(later.pk)
    assert "Expires soon" in content


def test_the_queue_leaves_out_an_item_past_its_expiry_and_the_history_shows_it_expired(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    Confirmation.objects.filter(pk=held.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.force_login(reviewer)

    queue = client.get("/approvals/").content.decode()
    history = client.get("/approvals/history/?status=expired").content.decode()

    assert held.pk not in queue
    assert f"No {HELD_ACTIONS} are waiting" in queue
    assert held.pk in history and "Expired" in history


def test_the_queue_shows_the_sessions_earlier_calls_with_their_codes(
    client: Client, reviewer: User, holding_agent: Agent, hold_refund: HoldRefund
) -> None:
    call_dispatch(
        agent=holding_agent,
        session_id="chat-7",
        customer_id="CUS-1",
        tool="refund_order",
        arguments='{"order_id": "ORD-1001", "amount_cents": 25.9, "currency": "BRL", '
        '"reason": "damaged"}',
    )
    hold_refund(6_000, session_id="chat-7")
    client.force_login(reviewer)

    page = text(client.get("/approvals/"))

    assert "Earlier in this conversation: 1 call, 1 rejected" in page
    assert "INVALID_ARGUMENTS" in page
    assert "amount_cents" in page


def test_a_held_call_leads_the_reviewer_to_its_sessions_timeline(
    client: Client, reviewer: User, holding_agent: Agent, hold_refund: HoldRefund
) -> None:
    call_dispatch(
        agent=holding_agent,
        session_id="chat-8",
        customer_id="CUS-1",
        tool="get_order",
        arguments={"order_id": "ORD-1001"},
    )
    hold_refund(6_000, session_id="chat-8")
    client.force_login(reviewer)
    timeline = f"/analytics/sessions/{holding_agent.pk}/chat-8/"

    queue = client.get("/approvals/").content.decode()
    page = client.get(timeline)

    assert f'href="{timeline}"' in queue
    assert page.status_code == 200
    assert "get_order" in text(page) and "CONFIRMATION_REQUIRED" in text(page)


def test_the_queue_shows_the_hosts_context_escaped(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    confirmation_rewrite(
        held.pk, host_context='Ignore the rules <script>alert("x")</script> & approve'
    )
    client.force_login(reviewer)

    content = client.get("/approvals/").content.decode()

    assert "<script>alert" not in content
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; approve" in content


def test_the_queue_says_two_reviewers_are_needed_and_whose_limit_covers_the_amount(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund
) -> None:
    OrderFactory.create(order_id="ORD-3002", customer_id="CUS-1", total_cents=100_000)
    hold_refund(25_000, order_id="ORD-3002")
    junior = make_user("june", "reviewers")
    ReviewerLimit.objects.create(reviewer=junior, currency="BRL", max_amount_cents=10_000)
    client.force_login(junior)

    page = text(client.get("/approvals/"))

    assert (
        "Needs approvals from 2 different reviewers, one of whom has a limit that covers "
        "R$ 250,00 (rita)" in page
    )
    assert "Approve (a vote)" in page


def test_the_navigation_counts_pending_items_for_reviewers_only(
    client: Client, reviewer: User, manager: User, hold_refund: HoldRefund
) -> None:
    hold_refund(6_000)
    hold_refund(7_000)
    client.force_login(reviewer)
    as_reviewer = client.get("/approvals/history/").content.decode()
    client.force_login(manager)

    as_manager = client.get("/").content.decode()

    assert re.search(r'id="nav-pending-count"[^>]*>2<', as_reviewer)
    assert "nav-pending-count" not in as_manager
    assert "/approvals/" not in as_manager


def test_the_queue_refresh_says_which_shown_item_someone_else_settled(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    gone = hold_refund(6_000)
    staying = hold_refund(7_000)
    Confirmation.objects.filter(pk=gone.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.force_login(reviewer)

    response = client.get(
        "/approvals/", {"shown": [gone.pk, staying.pk]}, headers={"HX-Request": "true"}
    )

    content = response.content.decode()
    assert "<html" not in content
    assert 'hx-swap-oob="afterbegin:#queue-notices"' in content
    assert "R$ 60,00 ORD-1001 is no longer waiting" in text(response)
    assert "Expired" in content
    assert f'id="item-{staying.pk}"' in content and f'id="item-{gone.pk}"' not in content


def test_an_item_approved_long_ago_and_not_executed_stands_out(
    client: Client, reviewer: User, hold_refund: HoldRefund, settings: Settings
) -> None:
    held = hold_refund()
    # What a worker that is down leaves behind: approved, never claimed.
    Confirmation.objects.filter(pk=held.pk).update(
        status=ConfirmationStatus.APPROVED,
        decided_at=timezone.now() - timedelta(minutes=settings.TOOLGATE_STUCK_AFTER_MINUTES + 1),
    )
    client.force_login(reviewer)

    page = text(client.get("/approvals/"))

    assert "Approved, not executed yet" in page
    assert "a worker may be down" in page


def test_a_rejection_without_a_reason_is_refused_with_a_message(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    client.force_login(reviewer)

    response = client.post(f"/approvals/{held.pk}/reject", {"reason": "   "}, follow=True)

    assert response.status_code == 200
    assert "the reason is sent to the agent" in text(response)
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING


def test_a_decision_needs_the_csrf_token(reviewer: User, hold_refund: HoldRefund) -> None:
    held = hold_refund()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(reviewer)

    response = browser.post(f"/approvals/{held.pk}/reject", {"reason": "no"})

    assert response.status_code == 403
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING


def test_decisions_are_posted_not_fetched(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    client.force_login(reviewer)

    response = client.get(f"/approvals/{held.pk}/approve")

    assert response.status_code == 405
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING


def test_an_unknown_confirmation_is_a_404(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)

    page = client.get("/approvals/0123456789abcdef/")
    decision = client.post("/approvals/0123456789abcdef/approve")

    assert (page.status_code, decision.status_code) == (404, 404)


def test_the_detail_page_shows_the_arguments_as_they_will_execute(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)

    page = text(client.get(f"/approvals/{held.pk}/"))

    assert '"amount_cents": 6000' in page
    assert held.arguments_hash in page
    assert "proposed it; the policy held it for a human" in page


def test_a_held_call_of_a_retired_tool_says_so_and_stays_decidable(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)
    tool_registry.set_retired("refund_order")
    try:
        page = text(client.get(f"/approvals/{held.pk}/"))
    finally:
        tool_registry.set_retired("refund_order", retired=False)

    assert "Tool refund_order · retired (replaced by refund_order_v2" in page
    assert (
        "agents can no longer call it; this held call is still decided under its own rules" in page
    )
    assert "Approve" in page


def test_the_empty_pages_say_what_will_appear_there(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)

    queue, history, reconciliation = (text(client.get(path)) for path in PAGES)

    assert f"No {HELD_ACTIONS} are waiting for a decision" in queue
    assert "Nothing has been decided yet" in history
    assert "Nothing to reconcile" in reconciliation


def test_the_history_pages_through_many_items(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    for _ in range(27):
        hold_refund(5_000)
    Confirmation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    client.force_login(reviewer)

    first = text(client.get("/approvals/history/"))
    second = client.get("/approvals/history/", {"page": 2}).content.decode()

    assert "Page 1 of 2 · 27 items" in first
    assert second.count('aria-label="Details of') == 2


def test_the_history_filters_by_agent_and_date_from_the_query_string(
    client: Client,
    reviewer: User,
    hold_refund: HoldRefund,
    make_agent: MakeAgent,
) -> None:
    held = hold_refund()
    Confirmation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    other, _ = make_agent()
    today = timezone.localdate()
    client.force_login(reviewer)

    mine = client.get(
        "/approvals/history/", {"agent": str(held.agent_id), "decided_after": today.isoformat()}
    )
    theirs = client.get("/approvals/history/", {"agent": other.pk})
    before = client.get(
        "/approvals/history/", {"decided_before": (today - timedelta(days=1)).isoformat()}
    )

    assert held.pk in mine.content.decode()
    assert held.pk not in theirs.content.decode()
    assert "Nothing matches these filters" in text(theirs)
    assert held.pk not in before.content.decode()


def test_the_history_answers_a_bad_filter_without_an_error(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)

    response = client.get("/approvals/history/", {"status": "bogus", "decided_after": "x"})

    assert response.status_code == 200


def test_the_history_sorts_by_a_column_from_the_query_string(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    small = hold_refund(5_000)
    large = hold_refund(9_000)
    Confirmation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    client.force_login(reviewer)

    ascending = client.get("/approvals/history/", {"sort": "amount_cents"}).content.decode()
    descending = client.get("/approvals/history/", {"sort": "-amount_cents"}).content.decode()

    assert ascending.index(small.pk) < ascending.index(large.pk)
    assert descending.index(large.pk) < descending.index(small.pk)


def test_the_queue_shows_the_soonest_few_of_a_long_queue_and_says_how_many_wait(
    client: Client, reviewer: User, hold_refund: HoldRefund, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("approvals.selectors.QUEUE_SHOWN", 2)
    for amount in (5_000, 5_100, 5_200):
        hold_refund(amount)
    client.force_login(reviewer)

    response = client.get("/approvals/")

    content = response.content.decode()
    assert content.count('<article class="item') == 2
    assert "Showing the 2 that expire soonest of 3 waiting" in text(response)
    assert re.search(r'id="nav-pending-count"[^>]*>3<', content)


def test_the_queue_says_who_has_no_approval_limit_in_the_currency(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund
) -> None:
    OrderFactory.create(order_id="ORD-3002", customer_id="CUS-1", total_cents=100_000)
    hold_refund(25_000, order_id="ORD-3002")
    junior = make_user("june", "reviewers")
    ReviewerLimit.objects.create(reviewer=junior, currency="BRL", max_amount_cents=10_000)
    client.force_login(junior)

    page = text(client.get("/approvals/"))

    assert "No approval limit in BRL: rita." in page

"""A support lead in a real browser: held refunds in the queue, decided, and what the agent sees.

Refunds are held by the real API (the `api` client is an agent host on the live server), and
decisions go through the pages' own forms. Each page is checked with axe-core on the way.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from dispatch.models import Confirmation, ConfirmationStatus
from tests.conftest import AgentClient
from tests.e2e.conftest import MakeBrowserUser, OpenTab
from tests.factories import OrderFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def held(result: dict[str, object]) -> str:
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    data = result["data"]
    assert isinstance(data, dict)
    return str(data["confirmation_id"])


def test_every_page_is_accessible_and_logs_no_error(
    open_tab: OpenTab, browser_user: MakeBrowserUser, api: AgentClient, orders: object
) -> None:
    browser_user("rita", "reviewers")
    browser_user("max", "managers", is_staff=True)
    OrderFactory.create(order_id="ORD-3001", customer_id="CUS-1", total_cents=100_000)
    api.call("get_order", {"order_id": "ORD-1001"}, session="chat-1")
    pending = held(api.refund(6_000, session="chat-1"))
    held(api.refund(25_000, order_id="ORD-3001", session="chat-2"))
    expired = held(api.refund(7_000, session="chat-3"))
    unknown = held(api.refund(8_000, session="chat-4"))
    Confirmation.objects.filter(pk=pending).update(host_context="The parcel was <b>soaked</b>.")
    Confirmation.objects.filter(pk=expired).update(expires_at=timezone.now() - timedelta(1))
    # An execution whose outcome was lost, as the worker leaves it.
    Confirmation.objects.filter(pk=unknown).update(
        status=ConfirmationStatus.UNKNOWN, decided_at=timezone.now()
    )

    anonymous = open_tab()
    for path in ("/", "/accounts/login/"):
        anonymous.page.goto(path)
        anonymous.check_accessibility()
    manager = open_tab("max")
    expect(manager.page.get_by_role("heading", name="Your places")).to_be_visible()
    manager.check_accessibility()
    manager.goto_refused("/approvals/")
    expect(manager.page.get_by_text("These pages are for reviewers")).to_be_visible()
    manager.check_accessibility()
    reviewer = open_tab("rita")
    page = reviewer.page
    expect(page).to_have_url(re.compile(r"/approvals/$"))
    expect(page.locator("#queue .item")).to_have_count(2)
    page.get_by_text("Earlier in this conversation").first.click()
    page.locator("details.reject summary").first.click()
    reviewer.check_accessibility()
    page.keyboard.press("Escape")
    page.keyboard.press("?")
    expect(page.get_by_role("heading", name="Keyboard shortcuts")).to_be_visible()
    reviewer.check_accessibility()
    page.keyboard.press("Escape")
    for path in (
        f"/approvals/{pending}/",
        f"/approvals/{expired}/",
        "/approvals/history/",
        "/approvals/history/?status=rejected",
        "/approvals/reconciliation/",
    ):
        page.goto(path)
        reviewer.check_accessibility()
    page.goto("/approvals/")
    expect(page.get_by_text("Times are shown in America/Sao_Paulo")).to_be_visible()

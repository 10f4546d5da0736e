"""A manager and a support lead read the records in a real browser: from the navigation to a
number's calls, to a call, its confirmation and its order, and back, with no 403 and no admin
page on the way; every page passes axe-core and logs no error. On a phone's width the navigation
folds into one line and the keyboard hint is gone."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Response, expect

from tests.conftest import AgentClient
from tests.e2e.conftest import MakeBrowserUser, OpenTab, Tab
from tests.e2e.test_reviewer_browser import held

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def watch_statuses(tab: Tab) -> list[str]:
    """Every document or request the pages make that answers 4xx or 5xx, or opens the admin."""
    bad: list[str] = []

    def on_response(response: Response) -> None:
        if response.status >= 400 or "/admin/" in response.url:
            bad.append(f"{response.status} {response.url}")

    tab.page.on("response", on_response)
    return bad


def test_a_manager_follows_a_call_to_its_confirmation_and_order_and_back(
    open_tab: OpenTab, browser_user: MakeBrowserUser, api: AgentClient, orders: object
) -> None:
    browser_user("max", "managers", is_staff=True)
    api.call("get_order", {"order_id": "ORD-1001"}, session="chat-1")
    confirmation_id = held(api.refund(6_000, session="chat-1"))
    manager = open_tab("max")
    bad = watch_statuses(manager)
    page = manager.page

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Calls").click()
    expect(page.get_by_role("heading", name="2 calls")).to_be_visible()
    manager.check_accessibility()
    page.get_by_label("Arguments contain").fill("ord-1001")
    page.get_by_label("Session").fill("chat-1")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"q=ord-1001"))
    expect(page.locator(".an-call")).to_have_count(2)
    page.get_by_role("link", name="confirmation pending").click()

    expect(page).to_have_url(re.compile(rf"/records/confirmations/{confirmation_id}/$"))
    expect(page.locator(".page-head .pill")).to_contain_text("Pending")
    expect(page.get_by_text("R$ 60,00").first).to_be_visible()
    manager.check_accessibility()
    page.get_by_role("link", name="ORD-1001", exact=True).click()

    expect(page.get_by_role("heading", name="ORD-1001")).to_be_visible()
    expect(page.locator("#held-title + p + .table-wrap")).to_contain_text("R$ 60,00")
    manager.check_accessibility()
    page.get_by_role("link", name="Confirmations").first.click()
    expect(page.get_by_role("heading", name="Confirmations")).to_be_visible()
    manager.check_accessibility()
    page.locator(f'a[href="/records/confirmations/{confirmation_id}/"]').click()
    page.get_by_role("link", name="chat-1").click()
    expect(page.get_by_role("heading", name=re.compile("Session"))).to_be_visible()
    page.go_back()
    expect(page).to_have_url(re.compile(rf"/records/confirmations/{confirmation_id}/$"))
    for name in ("Security events", "Orders"):
        page.get_by_role("navigation", name="Main").get_by_role("link", name=name).click()
        expect(page.get_by_role("heading", name=name)).to_be_visible()
        manager.check_accessibility()
    assert bad == []


def test_a_reviewer_reads_the_refunds_behind_an_order_and_the_phone_layout(
    open_tab: OpenTab, browser_user: MakeBrowserUser, api: AgentClient, orders: object
) -> None:
    browser_user("rita", "reviewers")
    assert api.refund(2_000, session="chat-1")["ok"] is True
    confirmation_id = held(api.refund(6_000, session="chat-2"))
    reviewer = open_tab("rita")
    bad = watch_statuses(reviewer)
    page = reviewer.page

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Orders").click()
    page.get_by_role("link", name="ORD-1001").click()
    refunds = page.locator("#refunds")
    expect(refunds).to_contain_text("R$ 20,00")
    expect(refunds.locator("tfoot td").first).to_have_text("R$ 20,00")
    reviewer.check_accessibility()
    page.locator(f'#held-title ~ .table-wrap a[title="{confirmation_id}"]').click()
    # A reviewer reads a held call on their own page, where they may decide it.
    expect(page).to_have_url(re.compile(rf"/approvals/{confirmation_id}/$"))

    page.set_viewport_size({"width": 390, "height": 800})
    page.goto("/approvals/")
    header = page.locator("header.site")
    assert (header.bounding_box() or {"height": 999})["height"] < 80
    expect(page.locator(".keys-hint")).to_be_hidden()
    menu = page.get_by_role("button", name="Menu")
    expect(page.get_by_role("link", name="History")).to_be_hidden()
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("link", name="History")).to_be_visible()
    reviewer.check_accessibility()
    assert bad == []

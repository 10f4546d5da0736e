"""The queue as a compact list, in a real browser: how many held calls a screen shows on a desk
and on a phone, its keys, and a call decided from it on a phone-sized page."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Page, expect

from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.services import call_dispatch
from orders.models import Refund
from tests.conftest import MakeAgent
from tests.e2e.conftest import MakeBrowserUser, OpenTab
from tests.factories import OrderFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESK = (1400, 1000)
PHONE = (390, 844)

# Counted in whole rows, top to bottom of the first screen, with the site's header above them.
ROWS_ON_SCREEN = """() => Array.from(document.querySelectorAll('#queue tr.item')).filter((row) => {
    const box = row.getBoundingClientRect();
    return box.top >= 0 && box.bottom <= window.innerHeight;
}).length"""


def hold_refunds(agent: Agent, count: int) -> list[str]:
    """`count` refunds of 60.00, each of a customer of its own (so that no sum joins them),
    held for a human, the first to expire first."""
    held = []
    for number in range(1, count + 1):
        order_id = f"ORD-{7000 + number}"
        OrderFactory.create(order_id=order_id, customer_id=f"CUS-{700 + number}", total_cents=9_000)
        result = call_dispatch(
            agent=agent,
            session_id=f"chat-{number}",
            customer_id=f"CUS-{700 + number}",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": order_id,
                    "amount_cents": 6_000,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )
        assert result.code == "CONFIRMATION_REQUIRED", result.message
        held.append(str(result.data["confirmation_id"]))
    return held


def rows_on_screen(page: Page, size: tuple[int, int]) -> int:
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto("/approvals/list/")
    return int(page.evaluate(ROWS_ON_SCREEN))


def test_the_list_shows_at_least_15_held_calls_on_a_desk_screen_and_fits_a_phone(
    open_tab: OpenTab, browser_user: MakeBrowserUser, make_agent: MakeAgent
) -> None:
    browser_user("rita", "reviewers")
    hold_refunds(make_agent()[0], 30)
    reviewer = open_tab("rita")
    page = reviewer.page

    on_desk = rows_on_screen(page, DESK)
    reviewer.check_accessibility()
    on_phone = rows_on_screen(page, PHONE)
    wider = page.evaluate("() => document.documentElement.scrollWidth > window.innerWidth")
    reviewer.check_accessibility()

    print(f"\nheld calls per screen in the list: {on_desk} at 1400x1000, {on_phone} at 390x844")
    assert on_desk >= 15
    assert on_phone >= 8
    assert not wider, "the list is wider than a phone's screen"
    # Every row says what the card says first: amount, what, customer, why, expiry, approvals.
    row = page.locator("#queue tr.item").first
    page.goto("/approvals/list/")
    expect(row).to_contain_text("R$ 60,00")
    expect(row).to_contain_text("Refund order · ORD-7001")
    expect(row).to_contain_text("CUS-701")
    expect(row).to_contain_text("is not below R$ 50,00")
    expect(row).to_contain_text(re.compile(r"in\s\d+\sminutes"))
    expect(row).to_contain_text("0 of 1")


def test_a_reviewer_decides_a_call_from_the_list_on_a_phone(
    open_tab: OpenTab, browser_user: MakeBrowserUser, make_agent: MakeAgent
) -> None:
    browser_user("rita", "reviewers")
    first, second, third = hold_refunds(make_agent()[0], 3)
    reviewer = open_tab("rita")
    page = reviewer.page
    page.set_viewport_size({"width": PHONE[0], "height": PHONE[1]})
    page.goto("/approvals/list/")

    # Choosing a row (anywhere but its buttons) opens its card.
    page.locator(f"#row-{third} td.customer").click()
    expect(page).to_have_url(re.compile(rf"/approvals/{third}/$"))
    page.go_back()
    page.locator(f"#row-{second}").get_by_role("button", name="Approve").click()

    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order R$ 60,00 ORD-7002")
    expect(page).to_have_url(re.compile(r"/approvals/list/$"))
    expect(page.locator("#queue tr.item")).to_have_count(2)
    reviewer.check_accessibility()
    assert Confirmation.objects.get(pk=second).status == ConfirmationStatus.EXECUTED
    assert list(Refund.objects.values_list("order__order_id", "amount_cents")) == [
        ("ORD-7002", 6_000)
    ]
    assert Confirmation.objects.get(pk=first).status == ConfirmationStatus.PENDING


def test_the_list_answers_the_queues_keys(
    open_tab: OpenTab, browser_user: MakeBrowserUser, make_agent: MakeAgent
) -> None:
    browser_user("rita", "reviewers")
    first, second, third = hold_refunds(make_agent()[0], 3)
    page = open_tab("rita").page
    page.goto("/approvals/list/")

    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(page.locator(f"#row-{second}")).to_have_class(re.compile("selected"))
    page.keyboard.press("a")
    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order R$ 60,00 ORD-7002")
    page.keyboard.press("j")
    page.keyboard.press("o")
    expect(page).to_have_url(re.compile(rf"/approvals/{first}/$"))
    page.go_back()
    page.keyboard.press("k")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("r")
    expect(page).to_have_url(re.compile(rf"/approvals/{third}/\?reject=1$"))
    expect(page.locator("details.reject textarea")).to_be_focused()
    page.keyboard.type("Not our order")
    page.keyboard.press("Enter")

    expect(page.get_by_role("status")).to_contain_text("Rejected: Refund order R$ 60,00")
    assert Confirmation.objects.get(pk=third).status == ConfirmationStatus.REJECTED
    assert Confirmation.objects.get(pk=first).status == ConfirmationStatus.PENDING

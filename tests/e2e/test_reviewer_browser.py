"""A support lead in a real browser: held calls in the queue, decided, and what the agent sees.

Refunds, and a test-only domain's vouchers (tests.approvals.goodwill), are held by the real API
(the `api` client is an agent host on the live server), and decisions go through the pages' own
forms. Each page is checked with axe-core on the way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect
from pytest_django.fixtures import Settings

from dispatch.models import Confirmation, ConfirmationStatus
from tests.approvals.goodwill import GOODWILL_TOOLS, GoodwillDesk, goodwill_registered, opened_desk
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent, confirmation_rewrite
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
    confirmation_rewrite(pending, host_context="The parcel was <b>soaked</b>.")
    Confirmation.objects.filter(pk=expired).update(expires_at=timezone.now() - timedelta(1))
    # An execution whose outcome was lost, as the worker leaves it.
    confirmation_rewrite(unknown, status=ConfirmationStatus.UNKNOWN, decided_at=timezone.now())

    anonymous = open_tab()
    for path in ("/", "/accounts/login/"):
        anonymous.page.goto(path)
        anonymous.check_accessibility()
    manager = open_tab("max")
    expect(manager.page).to_have_url(re.compile(r"/analytics/$"))
    manager.page.goto("/")
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


def test_a_reviewer_approves_a_refund_the_api_just_held_and_sees_it_executed(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    api: AgentClient,
    orders: object,
    ledger: Ledger,
) -> None:
    browser_user("rita", "reviewers")
    confirmation_id = held(api.refund(6_000, session="chat-1"))
    reviewer = open_tab("rita")
    page = reviewer.page
    item = page.locator(f"#item-{confirmation_id}")
    expect(item).to_contain_text("R$ 60,00")
    expect(item.locator("dt:text('Still refundable') + dd")).to_have_text("R$\xa0120,00")

    item.get_by_role("button", name="Approve").click()

    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order R$ 60,00 ORD-1001")
    page.goto(f"/approvals/{confirmation_id}/")
    expect(page.locator(".page-head .pill")).to_have_text(re.compile("Executed"))
    expect(page.locator(".timeline")).to_contain_text("worker executed it")
    reviewer.check_accessibility()
    state = api.get(f"/api/v1/confirmations/{confirmation_id}").json()
    assert state["status"] == "executed"
    assert state["result"]["ok"] is True
    assert ledger.state("ORD-1001") == (1, 6_000)


def test_a_rejection_typed_with_the_keyboard_reaches_the_agent(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    api: AgentClient,
    orders: object,
    ledger: Ledger,
) -> None:
    browser_user("rita", "reviewers")
    confirmation_id = held(api.refund(6_000, session="chat-1"))
    page = open_tab("rita").page

    page.keyboard.press("j")
    page.keyboard.press("r")
    page.keyboard.type("Outside the 30-day return window")
    page.keyboard.press("Enter")

    expect(page.get_by_role("status")).to_contain_text("Rejected: Refund order R$ 60,00")
    state = api.get(f"/api/v1/confirmations/{confirmation_id}").json()
    assert state["status"] == "rejected"
    assert "Outside the 30-day return window" in state["result"]["message"]
    again = api.refund(6_000, session="chat-1")
    assert again["code"] == "CONFIRMATION_REJECTED"
    assert "Outside the 30-day return window" in again["model_text"]
    assert ledger.state("ORD-1001") == (0, 0)


def test_two_reviewers_decide_a_large_refund_and_the_first_sees_it_settled(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    api: AgentClient,
    orders: object,
    ledger: Ledger,
    settings: Settings,
) -> None:
    browser_user("rita", "reviewers")
    browser_user("june", "reviewers")
    OrderFactory.create(order_id="ORD-3001", customer_id="CUS-1", total_cents=100_000)
    confirmation_id = held(api.refund(25_000, order_id="ORD-3001", session="chat-2"))
    settings.TOOLGATE_QUEUE_REFRESH_SECONDS = 1
    rita, june = open_tab("rita").page, open_tab("june").page

    rita.locator(f"#item-{confirmation_id}").get_by_role("button", name="Approve").click()
    expect(rita.get_by_role("status")).to_contain_text("Needs another reviewer's approval")
    june.reload()
    june.keyboard.press("j")
    june.keyboard.press("a")

    expect(june.get_by_role("status")).to_contain_text("Executed: Refund order R$ 250,00")
    # Rita's queue reloads by itself and says who settled what she had on screen.
    notice = rita.locator("#queue-notices")
    expect(notice).to_contain_text("R$ 250,00 ORD-3001 is no longer waiting", timeout=10_000)
    expect(notice).to_contain_text("by june")
    expect(rita.locator(f"#item-{confirmation_id}")).to_have_count(0)
    expect(rita.locator("#nav-pending-count")).to_have_text("0")
    assert ledger.state("ORD-3001") == (1, 25_000)


def test_an_item_that_expires_while_on_screen_cannot_be_approved(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    api: AgentClient,
    orders: object,
    ledger: Ledger,
) -> None:
    browser_user("rita", "reviewers")
    confirmation_id = held(api.refund(6_000, session="chat-1"))
    page = open_tab("rita").page
    approve = page.locator(f"#item-{confirmation_id}").get_by_role("button", name="Approve")
    expect(approve).to_be_visible()
    Confirmation.objects.filter(pk=confirmation_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    approve.click()

    expect(page.get_by_role("alert")).to_contain_text("it can no longer be approved")
    expect(page.locator(f"#item-{confirmation_id}")).to_have_count(0)
    assert api.get(f"/api/v1/confirmations/{confirmation_id}").json()["status"] == "expired"
    assert ledger.state("ORD-1001") == (0, 0)


@pytest.fixture
def goodwill_desk() -> Iterator[GoodwillDesk]:
    with goodwill_registered(opened_desk()) as desk:
        yield desk


def test_a_reviewer_approves_a_voucher_of_another_domain_and_its_own_handler_issues_it(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    make_agent: MakeAgent,
    client_for: ClientFor,
    goodwill_desk: GoodwillDesk,
) -> None:
    browser_user("rita", "reviewers")
    tools = ["get_order", "refund_order", *GOODWILL_TOOLS]
    api = client_for(make_agent(allowed_tools=tools, auto_approve_below_cents=5_000)[1])
    voucher = {
        "account_id": "ACC-7",
        "amount_cents": 8_000,
        "currency": "BRL",
        "occasion": "apology",
    }
    confirmation_id = held(api.call("issue_voucher", voucher, session="chat-1"))
    reviewer = open_tab("rita")
    page = reviewer.page
    item = page.locator(f"#item-{confirmation_id}")
    expect(item).to_contain_text("Issue voucher · ACC-7")
    expect(item.locator("dt:text('Vouchers this year') + dd")).to_have_text("R$\xa030,00")
    reviewer.check_accessibility()

    item.get_by_role("button", name="Approve").click()

    expect(page.get_by_role("status")).to_contain_text("Executed: Issue voucher R$ 80,00 ACC-7")
    page.goto(f"/approvals/{confirmation_id}/")
    reviewer.check_accessibility()
    assert api.get(f"/api/v1/confirmations/{confirmation_id}").json()["status"] == "executed"
    assert [issued.amount_cents for issued in goodwill_desk.vouchers.values()] == [8_000]


def test_approving_above_the_policys_amount_asks_once_more_and_below_it_is_one_key(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    make_agent: MakeAgent,
    client_for: ClientFor,
    orders: object,
    ledger: Ledger,
) -> None:
    browser_user("rita", "reviewers")
    # Held from 10.00 BRL; an approval above 50.00 BRL asks once more.
    _, token = make_agent(
        auto_approve_below_cents=1_000, two_reviewers_from_cents=None, confirm_above_cents=5_000
    )
    api = client_for(token)
    large = held(api.refund(8_000, session="chat-1"))
    small = held(api.refund(3_000, session="chat-2"))
    reviewer = open_tab("rita")
    page = reviewer.page
    card = page.locator(f"#item-{large}")
    # The two refunds of one order mention each other, with the sum the approval judges.
    expect(card).to_contain_text("1 other on the same order waiting too")
    expect(card.locator(f"a[href='/approvals/{small}/']")).to_be_visible()
    expect(card).to_contain_text("R$ 110,00")
    dialog = page.locator(f"#second-look-{large}")

    # The keyboard's approval of the large one opens the second look, and Esc leaves it as it was.
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("R$ 80,00 is above R$ 50,00")
    expect(dialog).to_contain_text("The customer's sum")
    expect(dialog).to_contain_text("R$ 110,00")
    reviewer.check_accessibility()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert Confirmation.objects.get(pk=large).status == ConfirmationStatus.PENDING
    assert ledger.state("ORD-1001") == (0, 0)

    # The button asks too; the dialog's own button approves.
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Yes, approve R$ 80,00").click()
    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order R$ 80,00 ORD-1001")
    assert ledger.state("ORD-1001") == (1, 8_000)

    # Below the amount, one key approves at once.
    expect(page.locator("#queue .item")).to_have_count(1)
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order R$ 30,00 ORD-1001")
    assert ledger.state("ORD-1001") == (2, 11_000)

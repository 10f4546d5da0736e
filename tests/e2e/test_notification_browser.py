"""A reviewer decides a held call from the link of the e-mail that announced it: read back from
a real SMTP server, opened in the browser, signed in, approved on the card."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from dispatch.models import Confirmation, ConfirmationStatus
from tests.approvals.notifications.conftest import smtp_stand_in
from tests.conftest import AgentClient, Ledger
from tests.e2e.conftest import PASSWORD, MakeBrowserUser, OpenTab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_approves_a_held_refund_from_the_emails_link(
    settings: Settings,
    live_server: LiveServer,
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    api: AgentClient,
    orders: object,
    ledger: Ledger,
) -> None:
    browser_user("rita", "reviewers", email="rita@example.test")
    with smtp_stand_in() as smtp_server:
        settings.TOOLGATE_NOTIFY_EMAIL = True
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = smtp_server.host, smtp_server.port
        settings.TOOLGATE_SITE_URL = live_server.url
        result = api.refund(6_000, session="chat-mail")
        assert result["code"] == "CONFIRMATION_REQUIRED", result
        confirmation_id = str(result["data"]["confirmation_id"])
        mail = smtp_server.wait_for(1)[0]
    found = re.search(r"(http://\S+/approvals/mail/\S+/)", mail.text())
    assert found is not None, mail.text()
    tab = open_tab()
    page = tab.page

    page.goto(found.group(1))
    page.get_by_label("Username").fill("rita")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(f"/approvals/{confirmation_id}/$"))
    tab.check_accessibility()
    page.locator(f"#item-{confirmation_id}").get_by_role("button", name="Approve").click()

    expect(page.get_by_role("status")).to_contain_text("Executed: Refund order")
    assert Confirmation.objects.get(pk=confirmation_id).status == ConfirmationStatus.EXECUTED
    assert ledger.state("ORD-1001") == (1, 6_000)

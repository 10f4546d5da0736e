"""Step-up in a real browser: a reviewer approving a refund above the policy's second-factor line is
asked for a code, enrols an authenticator app on allauth's pages (password again, the secret,
a code, the recovery codes), gives a code on the step-up page and approves; the refund executes
once. Every page passes axe-core and logs no error."""

from __future__ import annotations

import re
import time

import pytest
from allauth.mfa.app_settings import TOTP_PERIOD
from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value
from playwright.sync_api import expect
from pytest_django.fixtures import Settings

from dispatch.models import Confirmation, ConfirmationStatus
from orders.models import Order
from tests.approvals.conftest import refund_held_for
from tests.conftest import Ledger, MakeAgent
from tests.e2e.conftest import PASSWORD, MakeBrowserUser, OpenTab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def code_of(secret: str, step: int = 0) -> str:
    return str(format_hotp_value(hotp_value(secret, int(time.time()) // TOTP_PERIOD + step)))


def test_a_reviewer_steps_up_before_approving_above_the_line(
    open_tab: OpenTab,
    browser_user: MakeBrowserUser,
    make_agent: MakeAgent,
    orders: dict[str, Order],
    ledger: Ledger,
    settings: Settings,
) -> None:
    # A code of the next 30 seconds is taken too: the step-up gives one the enrolment did not use.
    settings.MFA_TOTP_TOLERANCE = 1
    agent = make_agent(factor_above_cents=8_000)[0]
    confirmation = refund_held_for(agent, 9_000)
    browser_user("rita", "reviewers")
    tab = open_tab("rita")
    page = tab.page
    card = f"/approvals/{confirmation.pk}/"

    page.goto(card)
    expect(page.get_by_text("Approving this amount asks for your second factor")).to_be_visible()
    page.get_by_role("button", name=re.compile("^Approve")).first.click()
    expect(page.get_by_role("heading", name="Your second factor")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("needs your second factor")
    tab.check_accessibility()
    page.get_by_role("link", name="set one up").click()
    page.locator("input[name=password]").fill(PASSWORD)
    page.get_by_role("button", name="Confirm").click()
    secret = page.locator("#authenticator_secret").input_value()
    tab.check_accessibility()
    page.get_by_label("Authenticator code").fill(code_of(secret))
    page.get_by_role("button", name="Activate").click()
    expect(page.get_by_role("heading", name="Recovery Codes")).to_be_visible()

    page.goto(card)
    page.get_by_role("button", name=re.compile("^Approve")).first.click()
    # The enrolment's code was used: the next window's is the fresh one.
    page.get_by_label("Code").fill(code_of(secret, step=1))
    page.get_by_role("button", name="Confirm it is me").click()
    expect(page.get_by_text("Second factor given: approve again.")).to_be_visible()
    expect(page).to_have_url(re.compile(re.escape(card) + "$"))
    page.get_by_role("button", name=re.compile("^Approve")).first.click()

    expect(page.get_by_role("status").first).to_contain_text(re.compile("xecuted|pproved"))
    # The approval posted without the factor was answered 403, as it should: the browser logs it.
    approve_url = f"{card}approve"
    tab.errors = [error for error in tab.errors if f"{approve_url}: Failed" not in error]
    assert Confirmation.objects.get(pk=confirmation.pk).status == ConfirmationStatus.EXECUTED
    assert ledger.state() == (1, 9_000)

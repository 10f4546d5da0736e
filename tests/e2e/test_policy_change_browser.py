"""A policy change in a real browser: one manager drafts it in the what-if and cannot approve it;
another reads its difference and its last 30 days, and approves it; the new version is in force.
Every page passes axe-core and logs no error."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from approvals.models import PolicyChange, PolicyChangeStatus
from dispatch.models import Agent
from tests.e2e.conftest import MakeBrowserUser, OpenTab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_change_drafted_by_one_manager_is_approved_by_another(
    open_tab: OpenTab, browser_user: MakeBrowserUser, agent: tuple[Agent, str]
) -> None:
    shop, _ = agent
    browser_user("ana", "managers")
    browser_user("bruno", "managers")
    author = open_tab("ana")
    page = author.page

    page.goto(f"/analytics/what-if/?agent={shop.pk}&range=30d")
    page.get_by_label("Auto-approve below (BRL)").fill("120")
    page.get_by_role("button", name="Judge again").click()
    page.get_by_label("Why").fill("fewer holds for small refunds")
    page.get_by_role("button", name="Propose this change").click()

    expect(page).to_have_url(re.compile(r"/analytics/policy-changes/\d+/$"))
    expect(page.get_by_role("heading", name="What it changes")).to_be_visible()
    expect(page.get_by_role("row", name=re.compile("BRL no human below"))).to_contain_text(
        "120.00 BRL"
    )
    expect(
        page.get_by_text("You drafted this change: another manager approves it.")
    ).to_be_visible()
    expect(page.get_by_role("button", name="Approve and put in force")).to_have_count(0)
    author.check_accessibility()
    change = PolicyChange.objects.get()

    approver = open_tab("bruno")
    other = approver.page
    other.get_by_role("navigation", name="Main").get_by_role("link", name="Policy changes").click()
    approver.check_accessibility()
    other.get_by_role("link", name=f"#{change.pk}").click()
    expect(other.get_by_role("heading", name="Its last 30 days under the draft")).to_be_visible()
    approver.check_accessibility()
    other.get_by_role("button", name="Approve and put in force").click()

    expect(other.get_by_text("Approved: the change is in force.")).to_be_visible()
    expect(other.get_by_role("listitem").filter(has_text="approved by bruno")).to_be_visible()
    change.refresh_from_db()
    shop.refresh_from_db()
    assert change.status == PolicyChangeStatus.APPROVED
    assert shop.current_policy is not None and shop.current_policy == change.policy
    assert shop.current_policy.limits()["BRL"].auto_approve_below_cents == 12_000  # type: ignore[index]

"""The policy changes' pages: drafted from the what-if or the admin, shown with their difference
and their what-if over the last 30 days, approved by another manager only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import PolicyChange, PolicyChangeStatus, PolicyEvent, PolicyEventKind
from dispatch.models import Agent, SecurityEvent
from tests.analytics import test_views
from tests.analytics.test_views import Traffic, login_in_group
from tests.conftest import LoginClient

pytestmark = pytest.mark.usefixtures("orders")

clock = test_views.clock
traffic = test_views.traffic


@pytest.fixture
def author(db: None) -> Client:
    return login_in_group("ana", "managers")


@pytest.fixture
def approver(db: None) -> Client:
    return login_in_group("bruno", "managers")


def _propose(client: Client, agent: Agent, **values: str) -> PolicyChange:
    response = client.post("/policy-changes/propose/", {"agent": str(agent.pk), **values})
    assert response.status_code == 302, response.content[:500]
    change = PolicyChange.objects.get()
    assert response["Location"] == f"/analytics/policy-changes/{change.pk}/"
    return change


def test_a_what_if_draft_is_proposed_and_shows_its_difference_and_last_30_days(
    traffic: Traffic, author: Client
) -> None:
    before = traffic.shop.current_policy_id
    page = author.get(
        "/analytics/what-if/", {"agent": str(traffic.shop.pk), "BRL_auto_approve_below": "200"}
    )
    assert "Propose this change" in page.content.decode()

    change = _propose(author, traffic.shop, BRL_auto_approve_below="200", note="fewer holds")
    response = author.get(f"/analytics/policy-changes/{change.pk}/")

    assert response.status_code == 200
    [line] = response.context["difference"]
    assert (line.what, line.before, line.after) == ("BRL no human below", "50.00 BRL", "200.00 BRL")
    rows = {row.outcome: (row.actual_calls, row.draft_calls) for row in response.context["rows"]}
    assert rows["auto_executed"] == (1, 2)
    assert "You drafted this change" in response.content.decode()
    traffic.shop.refresh_from_db()
    assert traffic.shop.current_policy_id == before


def test_the_author_approving_is_a_403_with_the_reason_and_a_security_event(
    traffic: Traffic, author: Client
) -> None:
    change = _propose(author, traffic.shop, BRL_auto_approve_below="200")

    response = author.post(f"/policy-changes/{change.pk}/approve/")

    assert response.status_code == 403
    assert "another manager must approve it" in response.content.decode()
    event = SecurityEvent.objects.get(reason="policy_change_own_draft")
    assert (event.channel, event.status, event.agent_id) == ("web", 403, traffic.shop.pk)
    assert PolicyChange.objects.get().status == PolicyChangeStatus.DRAFT
    assert traffic.shop.policies.count() == 1


def test_another_manager_approves_and_the_new_version_is_in_force(
    traffic: Traffic, author: Client, approver: Client
) -> None:
    change = _propose(author, traffic.shop, BRL_auto_approve_below="200")

    response = approver.post(f"/policy-changes/{change.pk}/approve/")

    assert response.status_code == 302
    traffic.shop.refresh_from_db()
    assert traffic.shop.current_policy is not None
    assert traffic.shop.current_policy.version == 2
    assert traffic.shop.current_policy.limits()["BRL"].auto_approve_below_cents == 20_000  # type: ignore[index]
    again = approver.post(f"/policy-changes/{change.pk}/approve/")
    assert again.status_code == 409
    assert traffic.shop.policies.count() == 2


def test_a_reviewers_limit_is_drafted_on_the_page(
    db: None, author: Client, approver: Client
) -> None:
    reviewer = User.objects.create_user("rita")
    response = author.post(
        "/policy-changes/limits/",
        {"reviewer": reviewer.pk, "currency": "brl", "amount": "150.00"},
    )
    change = PolicyChange.objects.get()
    assert response["Location"] == f"/analytics/policy-changes/{change.pk}/"

    approver.post(f"/policy-changes/{change.pk}/approve/")

    assert list(reviewer.approval_limits.values_list("currency", "max_amount_cents")) == [
        ("BRL", 15_000)
    ]


def test_the_pages_are_for_managers_only(traffic: Traffic) -> None:
    reviewer = login_in_group("rita", "reviewers")

    assert reviewer.get("/analytics/policy-changes/").status_code == 403
    assert (
        reviewer.post(
            "/policy-changes/propose/", {"agent": traffic.shop.pk, "BRL_auto_approve_below": "9"}
        ).status_code
        == 403
    )
    assert not PolicyChange.objects.exists()


def test_a_version_added_in_the_admin_is_a_draft(traffic: Traffic, approver: Client) -> None:
    User.objects.create_superuser("root", password="pw")
    admin = LoginClient()
    assert admin.login(username="root", password="pw")
    current = traffic.shop.current_policy
    assert current is not None
    form = {
        "agent": traffic.shop.pk,
        "allowed_tools": current.allowed_tools,
        "auto_approve_window_seconds": current.auto_approve_window_seconds,
        "step_budget": current.step_budget + 5,
        "repeat_limit": current.repeat_limit,
        "confirmation_ttl_seconds": current.confirmation_ttl_seconds,
    }
    for currency, limits in (current.limits() or {}).items():
        for name, cents in limits._asdict().items():
            form[f"{currency}_{name.removesuffix('_cents')}"] = (
                "" if cents is None else f"{cents / 100:.2f}"
            )

    response = admin.post("/admin/dispatch/policy/add/", form)

    change = PolicyChange.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/approvals/policychange/{change.pk}/change/"
    assert traffic.shop.policies.count() == 1
    approver.post(f"/policy-changes/{change.pk}/approve/")
    traffic.shop.refresh_from_db()
    assert traffic.shop.current_policy is not None
    assert traffic.shop.current_policy.step_budget == current.step_budget + 5


def test_disabling_an_agent_in_the_admin_is_one_persons_act_on_record(traffic: Traffic) -> None:
    User.objects.create_superuser("root", password="pw")
    admin = LoginClient()
    assert admin.login(username="root", password="pw")

    admin.post(
        "/admin/dispatch/agent/",
        {"action": "disable_agents", "_selected_action": [traffic.shop.pk]},
    )

    traffic.shop.refresh_from_db()
    assert not traffic.shop.is_active
    event = PolicyEvent.objects.get()
    assert (event.kind, event.actor_label, event.data["alone"]) == (
        PolicyEventKind.DISABLED,
        "root",
        True,
    )

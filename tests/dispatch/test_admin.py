"""The operator's admin: agents, policy versions, and the records the pipeline writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from approvals.models import PolicyChange
from approvals.policy_changes import policy_change_approve
from dispatch.models import Agent, AuditRecord, Confirmation, Policy
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import agent_authenticate, agent_create, call_dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent_and_token() -> tuple[Agent, str]:
    return agent_create(
        name="support-bot",
        allowed_tools=["get_order", "refund_order"],
        max_amount_cents=50_000,
        auto_approve_below_cents=5_000,
    )


@pytest.fixture
def agent(agent_and_token: tuple[Agent, str]) -> Agent:
    return agent_and_token[0]


def test_the_agent_list_shows_the_token_prefix_and_never_the_hash(
    admin_client: Client, agent: Agent
) -> None:
    response = admin_client.get("/admin/dispatch/agent/")

    assert response.status_code == 200
    assert agent.token_prefix.encode() in response.content
    assert agent.token_hash.encode() not in response.content
    assert b"create_agent" in response.content


def test_the_agent_page_keeps_the_token_read_only(admin_client: Client, agent: Agent) -> None:
    response = admin_client.get(f"/admin/dispatch/agent/{agent.pk}/change/")

    assert response.status_code == 200
    assert agent.token_hash.encode() not in response.content
    assert b'name="token_prefix"' not in response.content
    assert b'name="token_hash"' not in response.content
    assert b"add a new version" in response.content


def test_agents_are_not_added_or_deleted_in_the_admin(admin_client: Client, agent: Agent) -> None:
    assert admin_client.get("/admin/dispatch/agent/add/").status_code == 403
    assert admin_client.post(f"/admin/dispatch/agent/{agent.pk}/delete/").status_code == 403
    assert Agent.objects.filter(pk=agent.pk).exists()


def test_the_disable_action_stops_the_token(
    admin_client: Client, agent_and_token: tuple[Agent, str]
) -> None:
    agent, token = agent_and_token

    response = admin_client.post(
        "/admin/dispatch/agent/",
        {"action": "disable_agents", "_selected_action": [agent.pk]},
        follow=True,
    )

    assert response.status_code == 200
    agent.refresh_from_db()
    assert not agent.is_active
    assert agent_authenticate(token) is None


def test_adding_a_policy_drafts_a_version_that_another_manager_puts_in_force(
    admin_client: Client, admin_user: User, agent: Agent
) -> None:
    first = agent.current_policy
    assert first is not None

    response = admin_client.post(
        "/admin/dispatch/policy/add/",
        {
            "agent": agent.pk,
            "allowed_tools": ["get_order", "refund_order"],
            "auto_approve_window_seconds": 86_400,
            "step_budget": 20,
            "repeat_limit": 2,
            "confirmation_ttl_seconds": 3600,
            "human_refund_order": "always",
            # In each currency's major units; a currency left empty is held for a human.
            "BRL_max_amount": "100.00",
            "BRL_auto_approve_below": "0",
            "JPY_max_amount": "15000",
            "JPY_auto_approve_below": "1000",
            "JPY_two_reviewers_from": "8000",
            "KWD_max_amount": "30.5",
            "KWD_auto_approve_below": "2.250",
            "KWD_daily_cap": "10",
        },
    )

    assert response.status_code == 302, response.content
    assert agent.policies.count() == 1
    manager = User.objects.create_user("max")
    manager.groups.add(Group.objects.get_or_create(name="managers")[0])
    policy_change_approve(change_id=PolicyChange.objects.get().pk, approver=manager)
    agent.refresh_from_db()
    current = agent.current_policy
    assert current is not None
    assert (current.version, current.allowed_tools) == (2, ["get_order", "refund_order"])
    assert current.limits() == {
        "BRL": CurrencyLimits(10_000, 0, None, None),
        "JPY": CurrencyLimits(15_000, 1_000, 8_000, None),
        "KWD": CurrencyLimits(30_500, 2_250, None, 10_000),
    }
    assert current.human_rules == {"refund_order": "always"}
    assert current.created_by == admin_user
    first.refresh_from_db()
    assert (first.version, first.currency_limits) == (1, agent_first_limits(first))


def agent_first_limits(policy: Policy) -> dict[str, dict[str, int | None]]:
    return dict(policy.currency_limits or {})


def test_an_amount_finer_than_its_currency_is_a_form_error(
    admin_client: Client, agent: Agent
) -> None:
    response = admin_client.post(
        "/admin/dispatch/policy/add/",
        {
            "agent": agent.pk,
            "allowed_tools": ["get_order"],
            "auto_approve_window_seconds": 86_400,
            "step_budget": 20,
            "repeat_limit": 2,
            "confirmation_ttl_seconds": 3600,
            "JPY_max_amount": "150.5",
            "JPY_auto_approve_below": "0",
        },
    )

    assert response.status_code == 200
    assert "JPY max amount a call: 150.5 JPY is finer than its smallest unit" in (
        response.content.decode()
    )
    assert Policy.objects.filter(agent=agent).count() == 1


def test_the_add_form_for_an_agent_starts_from_its_current_policy(
    admin_client: Client, agent: Agent
) -> None:
    response = admin_client.get("/admin/dispatch/policy/add/", {"agent": agent.pk})

    assert response.status_code == 200
    # 50000 minor units of BRL, shown as the 500.00 an operator enters.
    assert b'name="BRL_max_amount" value="500.00"' in response.content
    assert b'name="KWD_max_amount"' in response.content
    assert b"never edited" in response.content


def test_a_policy_version_is_never_edited_or_deleted(admin_client: Client, agent: Agent) -> None:
    policy = agent.current_policy
    assert policy is not None
    limits = policy.currency_limits

    page = admin_client.get(f"/admin/dispatch/policy/{policy.pk}/change/")
    edit = admin_client.post(f"/admin/dispatch/policy/{policy.pk}/change/", {"BRL_max_amount": "1"})
    delete = admin_client.post(f"/admin/dispatch/policy/{policy.pk}/delete/")

    assert page.status_code == 200
    assert b'name="BRL_max_amount"' not in page.content
    assert b"BRL: max 500.00" in page.content
    assert (edit.status_code, delete.status_code) == (403, 403)
    policy.refresh_from_db()
    assert policy.currency_limits == limits
    assert Policy.objects.count() == 1


def _one_call(agent: Agent, order_id: str = "ORD-404") -> AuditRecord:
    result = call_dispatch(
        agent=agent,
        session_id="admin-s1",
        customer_id="CUS-1",
        tool="get_order",
        arguments={"order_id": order_id},
    )
    return AuditRecord.objects.get(call_id=result.call_id)


def test_audit_records_are_listed_filtered_and_searched_read_only(
    admin_client: Client, agent: Agent
) -> None:
    record = _one_call(agent)

    by_code = admin_client.get("/admin/dispatch/auditrecord/", {"code": "ORDER_NOT_FOUND"})
    by_session = admin_client.get("/admin/dispatch/auditrecord/", {"q": "admin-s1"})
    page = admin_client.get(f"/admin/dispatch/auditrecord/{record.pk}/change/")

    assert record.call_id.encode() in by_code.content
    assert record.call_id.encode() in by_session.content
    assert page.status_code == 200
    assert b'name="code"' not in page.content
    assert admin_client.get("/admin/dispatch/auditrecord/add/").status_code == 403
    assert admin_client.post(f"/admin/dispatch/auditrecord/{record.pk}/delete/").status_code == 403


def test_audit_records_drill_down_by_date(admin_client: Client, agent: Agent) -> None:
    # The date hierarchy groups by a truncated date with the time zone as a parameter: the kind of
    # query that parameters bound by the server (on PostgreSQL) must still answer.
    record = _one_call(agent)
    at = timezone.localtime(record.at)

    pages = [
        admin_client.get("/admin/dispatch/auditrecord/"),
        admin_client.get("/admin/dispatch/auditrecord/", {"at__year": at.year}),
        admin_client.get(
            "/admin/dispatch/auditrecord/", {"at__year": at.year, "at__month": at.month}
        ),
        admin_client.get(
            "/admin/dispatch/auditrecord/",
            {"at__year": at.year, "at__month": at.month, "at__day": at.day},
        ),
    ]

    assert [page.status_code for page in pages] == [200, 200, 200, 200]
    assert all(record.call_id.encode() in page.content for page in pages)


@pytest.mark.parametrize("model", ["session", "idempotencyrecord"])
def test_sessions_and_idempotency_records_are_read_only(
    admin_client: Client, agent: Agent, model: str
) -> None:
    _one_call(agent)

    listing = admin_client.get(f"/admin/dispatch/{model}/", {"q": "admin-s1"})

    assert listing.status_code == 200
    assert b"admin-s1" in listing.content
    assert admin_client.get(f"/admin/dispatch/{model}/add/").status_code == 403


def test_confirmations_are_listed_by_status_read_only(admin_client: Client, agent: Agent) -> None:
    now = timezone.now()
    Confirmation.objects.create(
        id="c0ffee",
        key="k" * 64,
        tool="refund_order",
        arguments={"order_id": "ORD-1001"},
        arguments_hash="h" * 64,
        agent=agent,
        session_id="admin-s1",
        customer_id="CUS-1",
        policy_version=1,
        amount_cents=9000,
        created_at=now,
        expires_at=now + timedelta(hours=1),
    )

    pending = admin_client.get("/admin/dispatch/confirmation/", {"status__exact": "pending"})
    approved = admin_client.get("/admin/dispatch/confirmation/", {"status__exact": "approved"})
    searched = admin_client.get("/admin/dispatch/confirmation/", {"q": "admin-s1"})

    local = timezone.localtime(now)
    by_month = admin_client.get(
        "/admin/dispatch/confirmation/",
        {"created_at__year": local.year, "created_at__month": local.month},
    )

    assert b"c0ffee" in pending.content
    assert b"c0ffee" not in approved.content
    assert b"c0ffee" in searched.content
    assert b"c0ffee" in by_month.content
    assert admin_client.get("/admin/dispatch/confirmation/add/").status_code == 403
    assert admin_client.post("/admin/dispatch/confirmation/c0ffee/delete/").status_code == 403


def _agent_form(agent: Agent, **changes: object) -> dict[str, object]:
    return {
        "name": agent.name,
        "is_active": "on",
        "webhook_url": agent.webhook_url,
        "policies-TOTAL_FORMS": "0",
        "policies-INITIAL_FORMS": str(agent.policies.count()),
        **changes,
    }


def test_setting_a_webhook_in_the_admin_shows_its_secret_once(
    admin_client: Client, agent: Agent
) -> None:
    url = f"/admin/dispatch/agent/{agent.pk}/change/"

    response = admin_client.post(url, _agent_form(agent, webhook_url="https://93.184.215.14/h"))
    page = admin_client.get(url)

    agent.refresh_from_db()
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    assert agent.webhook_url == "https://93.184.215.14/h"
    assert agent.webhook_secret.startswith("whsec_")
    assert agent.webhook_secret.encode() in response.content
    assert b"shown once" in response.content
    assert agent.webhook_secret.encode() not in page.content


def test_the_admin_refuses_a_private_webhook_url_and_keeps_the_agent_as_it_was(
    admin_client: Client, agent: Agent
) -> None:
    url = f"/admin/dispatch/agent/{agent.pk}/change/"

    response = admin_client.post(url, _agent_form(agent, webhook_url="https://10.0.0.7/h"))

    agent.refresh_from_db()
    assert response.status_code == 200
    assert b"not a public address" in response.content
    assert (agent.webhook_url, agent.webhook_secret) == ("", "")


def test_the_rotate_action_shows_the_new_webhook_secrets_once(
    admin_client: Client, agent: Agent
) -> None:
    admin_client.post(
        f"/admin/dispatch/agent/{agent.pk}/change/",
        _agent_form(agent, webhook_url="https://93.184.215.14/h"),
    )
    agent.refresh_from_db()
    first = agent.webhook_secret

    response = admin_client.post(
        "/admin/dispatch/agent/",
        {"action": "rotate_webhook_secrets", "_selected_action": [str(agent.pk)]},
    )

    agent.refresh_from_db()
    assert response.status_code == 200
    assert agent.webhook_secret != first
    assert agent.webhook_secret.encode() in response.content

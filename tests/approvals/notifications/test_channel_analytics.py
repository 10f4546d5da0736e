"""Held calls by channel on the managers' dashboard: time to decision from Slack and from the
pages, the escalations, reminders and expiries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from pytest_django import Settings

from analytics.channels import channel_figures
from analytics.fills import rollups_fill
from analytics.permissions import MANAGERS_GROUP
from approvals.notifications import escalations_due
from approvals.reviewers import REVIEWERS_GROUP
from approvals.services import confirmation_approve, confirmation_reject, confirmations_expire_due
from dispatch.models import Agent, Confirmation
from orders.models import Order
from tests.approvals.conftest import refund_call
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db(transaction=True)


def held(agent: Agent, amount_cents: int) -> Confirmation:
    result = refund_call(agent, amount_cents, session=f"s-{amount_cents}")
    return Confirmation.objects.get(pk=result.data["confirmation_id"])


def test_decisions_are_counted_by_channel_with_escalations_and_expiries(
    make_agent: MakeAgent, order: Order, settings: Settings
) -> None:
    # One reviewer decides any sum: each approval is the decision.
    agent, _ = make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=None)
    ana = User.objects.create_user("ana", password="pw")
    ana.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    by_slack, by_page, rejected, left = (held(agent, 6_000 + n * 100) for n in range(4))
    confirmation_approve(confirmation_id=by_slack.pk, reviewer=ana, channel="slack")
    confirmation_approve(confirmation_id=by_page.pk, reviewer=ana)
    confirmation_reject(confirmation_id=rejected.pk, reviewer=ana, reason="not this one")
    settings.TOOLGATE_NOTIFY_EMAIL = True  # an escalation is sent on a channel
    settings.TOOLGATE_NOTIFY_ESCALATE_AFTER_MINUTES = 1
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    escalations_due(now=timezone.now() + timedelta(minutes=2))
    Confirmation.objects.filter(pk=left.pk).update(expires_at=timezone.now())
    confirmations_expire_due()
    since = timezone.now() - timedelta(hours=1)

    figures = channel_figures(since=since, until=timezone.now() + timedelta(minutes=1))

    assert [(row["channel"], row["decided"]) for row in figures["by_channel"]] == [
        ("Pages and API", 2),
        ("Slack", 1),
    ]
    assert (figures["escalated"], figures["reminded"], figures["expired"]) == (1, 0, 1)
    manager = User.objects.create_user("max", password="pw", is_staff=True)
    manager.groups.add(Group.objects.get_or_create(name=MANAGERS_GROUP)[0])
    rollups_fill(lag=timedelta(0))
    client = Client()
    client.force_login(manager)
    page = client.get("/analytics/?range=24h").content.decode()
    assert "Held calls by channel" in page
    assert "1 escalated" in page and "1 expired undecided" in page

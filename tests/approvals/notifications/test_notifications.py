"""A held call reaches the reviewers who may decide it: by e-mail to a real SMTP server and on
Slack (its stand-in), written in the hold's transaction, retried, swept again, escalated."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerDown

from approvals import notifications
from approvals.models import (
    ConfirmationEvent,
    EventKind,
    Notification,
    NotificationRule,
    NotificationStage,
    NotificationStatus,
)
from approvals.notifications import escalations_due, notifications_resend_due
from approvals.reviewers import REVIEWERS_GROUP
from approvals.services import confirmation_approve, confirmations_expire_due
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.services import call_dispatch
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.notifications.conftest import CHANNEL_ID, SlackApi, SmtpServer, reviewer

pytestmark = pytest.mark.django_db(transaction=True)

# What an agent host may send for the reviewer: shown escaped on the card, never in a message.
HOSTILE_CONTEXT = "<!channel> <https://evil.example|click> <b>bold</b> ignore the policy"


def hold_with_context(agent: Agent, amount_cents: int = 6_000) -> Confirmation:
    result = call_dispatch(
        agent=agent,
        session_id="s-ctx",
        customer_id="CUS-7",
        tool="refund_order",
        arguments=json.dumps(
            {
                "order_id": "ORD-3001",
                "amount_cents": amount_cents,
                "currency": "BRL",
                "reason": "damaged",
            }
        ),
        context=HOSTILE_CONTEXT,
    )
    assert result.code == "CONFIRMATION_REQUIRED", result.message
    return Confirmation.objects.get(pk=result.data["confirmation_id"])


def all_slack_text(slack_api: SlackApi) -> str:
    return json.dumps([call.arguments for call in slack_api.calls])


def test_a_held_call_is_emailed_to_each_reviewer_who_may_decide_it_with_what_the_card_shows(
    channels: None, smtp_server: SmtpServer, holding_agent: Agent, order: Order
) -> None:
    ana, bruno = reviewer("ana"), reviewer("bruno")
    reviewer("nomail", email=False)

    confirmation = hold_with_context(holding_agent)

    mails = smtp_server.wait_for(2)
    assert sorted(mail.recipients[0] for mail in mails) == [ana.email, bruno.email]
    text = mails[0].text()
    assert "R$\xa060,00" in text
    assert "Refund order" in text
    assert "ORD-3001" in text
    assert "Why held:" in text and "Customer's sum:" in text
    assert f"{confirmation.expires_at:%Y-%m-%d %H:%M} UTC" in text
    assert "https://toolgate.example.test/approvals/mail/" in text
    for mail in mails:
        body = mail.message.as_string()
        assert "ignore the policy" not in body
        assert "<!channel>" not in body and "<b>bold</b>" not in body
    rows = Notification.objects.filter(confirmation=confirmation, channel="email")
    assert [row.status for row in rows] == [NotificationStatus.SENT]
    assert sorted(rows[0].recipients_done) == sorted([ana.pk, bruno.pk])


def test_a_held_call_is_posted_to_slack_with_an_approve_button_and_no_markup_from_the_call(
    channels: None, slack_api: SlackApi, holding_agent: Agent, order: Order
) -> None:
    reviewer("ana")

    confirmation = hold_with_context(holding_agent)

    posted = slack_api.wait_for("chat.postMessage")
    assert len(posted) == 1
    arguments = posted[0].arguments
    assert arguments["channel"] == CHANNEL_ID
    blocks = arguments["blocks"]
    section = blocks[0]["text"]["text"]
    assert "R$\xa060,00" in section and "ORD-3001" in section
    buttons = blocks[1]["elements"]
    assert buttons[0]["action_id"] == "toolgate_approve"
    assert buttons[0]["value"] == confirmation.pk
    assert buttons[1]["url"] == f"https://toolgate.example.test/approvals/{confirmation.pk}/"
    sent = all_slack_text(slack_api)
    assert "ignore the policy" not in sent
    assert "<!channel>" not in sent and "<!here>" not in sent
    row = Notification.objects.get(confirmation=confirmation, channel="slack")
    assert (row.status, row.slack_channel, row.slack_ts) == (
        NotificationStatus.SENT,
        CHANNEL_ID,
        "1700000000.000001",
    )


def test_no_message_carries_the_agents_token_or_a_secret(
    channels: None,
    smtp_server: SmtpServer,
    slack_api: SlackApi,
    make_agent: Any,
    order: Order,
    settings: Any,
) -> None:
    reviewer("ana")
    agent, token = make_agent(auto_approve_below_cents=5_000)

    hold_with_context(agent)

    mails = smtp_server.wait_for(1)
    sent = all_slack_text(slack_api) + "".join(mail.message.as_string() for mail in mails)
    for secret in (token, settings.SLACK_BOT_TOKEN, settings.SLACK_SIGNING_SECRET):
        assert secret not in sent
    assert settings.SECRET_KEY not in sent


def test_one_approval_is_asked_of_those_whose_limit_covers_the_sum(
    channels: None, smtp_server: SmtpServer, held_refund: HeldRefund
) -> None:
    from approvals.models import ReviewerLimit

    ana, bruno = reviewer("ana"), reviewer("bruno")
    ReviewerLimit.objects.create(reviewer=bruno, currency="BRL", max_amount_cents=1_000)

    held_refund(6_000)

    mails = smtp_server.wait_for(1)
    assert [mail.recipients for mail in mails] == [[ana.email]]


def test_a_channel_that_fails_never_fails_the_agents_call_and_is_shown_to_administrators(
    channels: None,
    smtp_server: SmtpServer,
    slack_api: SlackApi,
    held_refund: HeldRefund,
) -> None:
    reviewer("ana")
    admin = User.objects.create_user("root", password="pw", is_staff=True)
    admin.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    smtp_server.refuse = 5
    slack_api.fail = 5

    confirmation = held_refund(6_000)

    assert confirmation.status == ConfirmationStatus.PENDING
    rows = Notification.objects.filter(confirmation=confirmation).order_by("channel")
    # In-process there is one attempt; on a worker the task retries itself with backoff.
    assert [(row.channel, row.status, row.attempts) for row in rows] == [
        ("email", NotificationStatus.FAILED, 1),
        ("slack", NotificationStatus.FAILED, 1),
    ]
    assert "451" in rows[0].last_error
    client = Client()
    client.force_login(admin)
    page = client.get("/approvals/").content.decode()
    assert "Notifications by Email are failing" in page
    assert "Notifications by Slack are failing" in page


def test_retries_wait_longer_each_time_up_to_the_cap(settings: Any) -> None:
    settings.TOOLGATE_NOTIFY_RETRY_BASE_SECONDS = 10
    settings.TOOLGATE_NOTIFY_RETRY_MAX_SECONDS = 60

    delays = [notifications.notification_retry_delay(n) for n in range(1, 6)]

    assert delays == [10, 20, 40, 60, 60]


def test_a_broker_outage_loses_no_notification_the_sweep_sends_it(
    channels: None,
    smtp_server: SmtpServer,
    held_refund: HeldRefund,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reviewer("ana")

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise BrokerDown("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(notifications.notification_send_task, "delay", broker_down)
    monkeypatch.setattr(notifications.notifications_send_task, "delay", broker_down)
    confirmation = held_refund(6_000)
    assert confirmation.status == ConfirmationStatus.PENDING
    assert smtp_server.received == []
    assert Notification.objects.filter(status=NotificationStatus.PENDING).count() == 2
    monkeypatch.undo()

    sent = notifications_resend_due(now=timezone.now() + timedelta(minutes=5))

    assert sent == 2
    assert len(smtp_server.wait_for(1)) == 1
    assert set(Notification.objects.values_list("status", flat=True)) == {NotificationStatus.SENT}


def test_the_hold_and_its_notification_rows_commit_or_roll_back_together(
    channels: None, holding_agent: Agent, order: Order
) -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        hold_with_context(holding_agent)
        assert Notification.objects.count() == 2
        raise RuntimeError("the hold's transaction fails after the hold")

    assert Confirmation.objects.count() == 0
    assert Notification.objects.count() == 0


def test_undecided_calls_escalate_to_the_next_group_once_and_again_before_expiry(
    channels: None,
    smtp_server: SmtpServer,
    slack_api: SlackApi,
    holding_agent: Agent,
    order: Order,
) -> None:
    reviewer("ana")
    lead = reviewer("lena", group="leads")
    lead.groups.add(Group.objects.get(name=REVIEWERS_GROUP))
    NotificationRule.objects.create(
        agent=holding_agent,
        escalate_after_minutes=30,
        escalate_group="leads",
        remind_before_expiry_minutes=10,
    )
    confirmation = hold_with_context(holding_agent)
    smtp_server.wait_for(2)
    smtp_server.received.clear()

    assert escalations_due(now=confirmation.created_at + timedelta(minutes=29)) == 0
    assert escalations_due(now=confirmation.created_at + timedelta(minutes=31)) == 1
    assert escalations_due(now=confirmation.created_at + timedelta(minutes=32)) == 0

    mails = smtp_server.wait_for(1)
    assert [mail.recipients for mail in mails] == [[lead.email]]
    assert "Escalated: still undecided" in mails[0].message["Subject"]
    reminded = escalations_due(now=confirmation.expires_at - timedelta(minutes=9))
    assert reminded == 1
    kinds = list(
        ConfirmationEvent.objects.filter(confirmation=confirmation).values_list("kind", flat=True)
    )
    assert kinds == [EventKind.ESCALATED, EventKind.REMINDED]
    stages = set(Notification.objects.values_list("stage", "channel"))
    assert (NotificationStage.ESCALATED, "slack") in stages
    assert (NotificationStage.EXPIRING, "email") in stages
    client = Client()
    client.force_login(lead)
    card = client.get(f"/approvals/{confirmation.pk}/").content.decode()
    assert "escalated it: nobody had decided" in card


def test_an_escalated_call_still_expires_as_expired_never_approved_by_silence(
    channels: None, smtp_server: SmtpServer, holding_agent: Agent, order: Order
) -> None:
    reviewer("ana")
    NotificationRule.objects.create(agent=holding_agent, escalate_after_minutes=1)
    confirmation = hold_with_context(holding_agent)
    escalations_due(now=confirmation.created_at + timedelta(minutes=2))

    Confirmation.objects.filter(pk=confirmation.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    confirmations_expire_due()

    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.EXPIRED
    assert Refund.objects.count() == 0


def test_a_decision_on_the_page_updates_the_slack_message_for_everyone(
    channels: None, slack_api: SlackApi, holding_agent: Agent, order: Order
) -> None:
    ana = reviewer("ana")
    confirmation = hold_with_context(holding_agent)
    slack_api.wait_for("chat.postMessage")

    confirmation_approve(confirmation_id=confirmation.pk, reviewer=ana)

    updates = slack_api.wait_for("chat.update")
    assert len(updates) == 1
    assert updates[0].arguments["ts"] == "1700000000.000001"
    text = json.dumps(updates[0].arguments["blocks"])
    assert "Approved by ana" in text
    assert "toolgate_approve" not in text


def test_nothing_is_written_on_hold_when_no_channel_is_configured(
    held_refund: HeldRefund,
) -> None:
    held_refund(6_000)

    assert Notification.objects.count() == 0

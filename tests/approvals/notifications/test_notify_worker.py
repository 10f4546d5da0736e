"""On a real Celery worker (tests/workers.py): a hold reaches the SMTP server and the Slack
stand-in, and a Slack button press is decided and executed by the worker while Slack is
answered at once."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.models import Notification, NotificationStatus
from approvals.reviewers import REVIEWERS_GROUP
from dispatch.models import Confirmation, ConfirmationStatus
from orders.models import Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.notifications.conftest import (
    BOT_TOKEN,
    CHANNEL_ID,
    SIGNING_SECRET,
    TEAM_ID,
    SlackApi,
    SmtpServer,
    button_body,
    slack_link,
    slack_post,
    slack_signed,
)
from tests.workers import StartWorker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def worker_channels(smtp_server: SmtpServer, slack_api: SlackApi) -> dict[str, str]:
    """The worker's environment: the same channels as the test's settings (`channels`)."""
    return {
        "TOOLGATE_NOTIFY_EMAIL": "true",
        "EMAIL_HOST": smtp_server.host,
        "EMAIL_PORT": str(smtp_server.port),
        "DEFAULT_FROM_EMAIL": "toolgate@example.test",
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "TOOLGATE_SLACK_TEAM_ID": TEAM_ID,
        "TOOLGATE_SLACK_CHANNEL": CHANNEL_ID,
        "TOOLGATE_SLACK_API_URL": slack_api.url,
        "TOOLGATE_SITE_URL": "https://toolgate.example.test",
    }


def status_of(confirmation: Confirmation) -> str:
    return str(Confirmation.objects.values_list("status", flat=True).get(pk=confirmation.pk))


def test_a_hold_reaches_email_and_slack_and_a_slack_press_executes_on_the_worker(
    channels: None,
    start_worker: StartWorker,
    smtp_server: SmtpServer,
    slack_api: SlackApi,
    held_refund: HeldRefund,
) -> None:
    ana = User.objects.create_user("ana", password="pw", email="ana@example.test")
    ana.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    slack_link(Client(), ana, "U0ANA")
    start_worker(**worker_channels(smtp_server, slack_api))

    confirmation = held_refund(6_000)

    assert smtp_server.wait_for(1)[0].recipients == ["ana@example.test"]
    assert slack_api.wait_for("chat.postMessage")[0].arguments["channel"] == CHANNEL_ID
    wait_until(
        lambda: (
            set(Notification.objects.values_list("status", flat=True)) == {NotificationStatus.SENT}
        ),
        "both notifications to be recorded as sent",
    )
    body = button_body(confirmation.pk, slack_user_id="U0ANA")
    started = time.monotonic()
    answer = slack_post(Client(), "/approvals/slack/actions", body, slack_signed(body))
    answered_in = time.monotonic() - started
    wait_until(lambda: status_of(confirmation) == ConfirmationStatus.EXECUTED, "the execution")

    assert answer.status_code == 200
    assert answered_in < 3
    assert Refund.objects.filter(amount_cents=6_000).count() == 1
    update = slack_api.wait_for("chat.update")[0]
    assert "Approved by ana from slack" in json.dumps(update.arguments["blocks"])

"""Two reviewers deciding the same held call at once, one from Slack and one on the card: one
decision, one execution, one refund (PostgreSQL's row locks decide who is first)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from approvals.models import ConfirmationEvent
from dispatch.models import Confirmation, ConfirmationStatus
from orders.models import Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.notifications.conftest import (
    SlackApi,
    button_body,
    reviewer,
    slack_link,
    slack_post,
    slack_signed,
)
from tests.threads import run_together

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="row locks and concurrent transactions need PostgreSQL",
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize("round_", range(3))
def test_slack_and_the_card_at_once_make_one_decision(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund, round_: int
) -> None:
    ana, bruno = reviewer("ana"), reviewer("bruno")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)
    body = button_body(confirmation.pk, slack_user_id="U0ANA")
    page = Client()
    page.force_login(bruno)

    def decide(index: int) -> Any:
        if index == 0:
            return slack_post(Client(), "/approvals/slack/actions", body, slack_signed(body))
        return page.post(f"/approvals/{confirmation.pk}/approve")

    results = run_together(2, decide)

    assert [getattr(result, "status_code", result) for result in results] == [200, 303]
    decided = ConfirmationEvent.objects.filter(confirmation=confirmation, kind="approved")
    assert decided.count() == 1
    assert Refund.objects.filter(amount_cents=6_000).count() == 1
    assert Confirmation.objects.get(pk=confirmation.pk).status == ConfirmationStatus.EXECUTED

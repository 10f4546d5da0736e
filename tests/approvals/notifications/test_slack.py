"""Deciding from Slack: requests signed as Slack signs them, a Slack user linked to a reviewer
from both sides, the Approve button through the decision core, and every bad request refused
with a security event and no money moved."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount, SocialToken
from django.test import Client
from django.utils import timezone

from approvals.models import ReviewerToken, SlackLink, Vote
from approvals.reviewers import reviewer_token_create
from dispatch.models import ConfirmationStatus, SecurityEvent
from orders.models import Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.notifications.conftest import (
    TEAM_ID,
    SlackApi,
    button_body,
    command_body,
    reviewer,
    slack_link,
    slack_post,
    slack_signed,
)

pytestmark = pytest.mark.django_db(transaction=True)

ACTIONS = "/approvals/slack/actions"
COMMANDS = "/approvals/slack/commands"


def events() -> list[tuple[str, str, int]]:
    return list(SecurityEvent.objects.order_by("id").values_list("channel", "reason", "status"))


def press(confirmation_id: str, slack_user_id: str, **signing: Any) -> Any:
    body = button_body(confirmation_id, slack_user_id=slack_user_id)
    return slack_post(Client(), ACTIONS, body, slack_signed(body, **signing))


def test_a_linked_reviewer_approves_from_slack_and_the_message_says_so(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)

    started = time.monotonic()
    answer = press(confirmation.pk, "U0ANA")
    answered_in = time.monotonic() - started

    assert answer.status_code == 200
    assert answered_in < 3
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(amount_cents=6_000).count() == 1
    approved = confirmation.events.get(kind="approved")
    assert (approved.actor_id, approved.data["channel"]) == (ana.pk, "slack")
    update = slack_api.wait_for("chat.update")[-1]
    assert "Approved by ana from slack" in json.dumps(update.arguments["blocks"])
    assert events() == []


def test_the_link_is_proven_from_both_sides_with_the_workspace_checked(
    channels: None, slack_api: SlackApi
) -> None:
    ana = reviewer("ana")
    client = Client()
    client.force_login(ana)
    code = client.post("/approvals/slack/link").context["code"]

    typed = command_body("link U0ANA", slack_user_id="U0MALLORY")
    refused_typed = slack_post(Client(), COMMANDS, typed, slack_signed(typed))
    foreign = command_body(f"link {code}", slack_user_id="U0ANA", team_id="T0OTHER")
    refused_foreign = slack_post(Client(), COMMANDS, foreign, slack_signed(foreign))
    own = command_body(f"link {code}", slack_user_id="U0ANA")
    linked = slack_post(Client(), COMMANDS, own, slack_signed(own))
    again = command_body(f"link {code}", slack_user_id="U0MALLORY")
    reused = slack_post(Client(), COMMANDS, again, slack_signed(again))

    assert "unknown or expired" in refused_typed.json()["text"]
    assert "not the one Toolgate accepts" in refused_foreign.json()["text"]
    assert "Linked: your Slack user decides as ana" in linked.json()["text"]
    assert "unknown or expired" in reused.json()["text"]
    link = SlackLink.objects.get(user=ana)
    assert (link.team_id, link.slack_user_id, link.code_hash) == (TEAM_ID, "U0ANA", "")
    assert [reason for _, reason, _ in events()] == [
        "slack_link_code_invalid",
        "slack_team_unknown",
        "slack_link_code_invalid",
    ]
    page = client.get("/approvals/slack/link").content.decode()
    assert "U0ANA" in page


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ("forged", "slack_signature_invalid"),
        ("stale", "slack_stale"),
        ("unsigned", "slack_unsigned"),
    ],
)
def test_a_request_not_signed_by_slack_now_decides_nothing(
    channels: None, held_refund: HeldRefund, tamper: str, reason: str
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)
    body = button_body(confirmation.pk, slack_user_id="U0ANA")
    headers = {
        "forged": slack_signed(body, secret="not-the-signing-secret"),
        "stale": slack_signed(body, at=int(time.time()) - 6 * 60),
        "unsigned": {},
    }[tamper]

    answer = slack_post(Client(), ACTIONS, body, headers)

    assert answer.status_code == 401
    assert answer.json()["error"] == reason
    assert events() == [("slack", reason, 401)]
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert Refund.objects.count() == 0


def test_a_replayed_request_is_refused_and_recorded(
    channels: None, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)
    body = button_body(confirmation.pk, slack_user_id="U0ANA")
    headers = slack_signed(body)
    first = slack_post(Client(), ACTIONS, body, headers)

    replayed = slack_post(Client(), ACTIONS, body, headers)

    assert first.status_code == 200
    assert (replayed.status_code, replayed.json()["error"]) == (401, "slack_replayed")
    assert events() == [("slack", "slack_replayed", 401)]
    assert Refund.objects.count() == 1


def test_a_slack_user_linked_to_nobody_decides_nothing(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    reviewer("ana")
    confirmation = held_refund(6_000)

    answer = press(confirmation.pk, "U0STRANGER")

    assert answer.status_code == 200  # Slack is answered; the refusal is told to the user
    told = slack_api.wait_for("chat.postEphemeral")
    assert told[0].arguments["user"] == "U0STRANGER"
    assert "linked to no reviewer" in told[0].arguments["text"]
    assert events() == [("slack", "slack_user_unlinked", 403)]
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert Refund.objects.count() == 0


def test_a_slack_user_whose_reviewer_lost_the_right_decides_nothing(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    ana.groups.clear()
    confirmation = held_refund(6_000)

    press(confirmation.pk, "U0ANA")

    told = slack_api.wait_for("chat.postEphemeral")
    assert "may not decide held calls" in told[0].arguments["text"]
    assert events() == [("slack", "slack_reviewer_without_right", 403)]
    assert Vote.objects.count() == 0
    assert Refund.objects.count() == 0


def test_a_slack_user_whose_provider_no_longer_vouches_for_them_decides_nothing(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    # A single sign-on reviewer whose provider's access token expired, with no refresh token.
    account = SocialAccount.objects.create(user=ana, provider="sso", uid="ana")
    SocialToken.objects.create(account=account, token="t", expires_at=timezone.now())
    reviewer_token_create(user=ana)
    confirmation = held_refund(6_000)

    press(confirmation.pk, "U0ANA")

    told = slack_api.wait_for("chat.postEphemeral")
    assert "no longer confirms your access" in told[0].arguments["text"]
    assert Vote.objects.count() == 0
    assert Refund.objects.count() == 0
    assert not ReviewerToken.objects.filter(user=ana).exists()


def test_a_workspace_other_than_the_configured_one_decides_nothing(
    channels: None, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)
    body = button_body(confirmation.pk, slack_user_id="U0ANA", team_id="T0OTHER")

    slack_post(Client(), ACTIONS, body, slack_signed(body))

    assert events() == [("slack", "slack_team_unknown", 403)]
    assert Refund.objects.count() == 0


def test_an_approval_that_needs_a_second_reviewer_opens_the_card_and_records_nothing(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    reviewer("bruno")
    slack_link(Client(), ana, "U0ANA")
    # From 200.00 two reviewers decide (the holding agent's policy).
    confirmation = held_refund(25_000)

    press(confirmation.pk, "U0ANA")

    told = slack_api.wait_for("chat.postEphemeral")[0].arguments["text"]
    assert "Not decided from Slack" in told
    assert f"https://toolgate.example.test/approvals/{confirmation.pk}/" in told
    assert Vote.objects.count() == 0
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert events() == []


def test_a_call_already_decided_is_not_decided_again_from_slack(
    channels: None, slack_api: SlackApi, held_refund: HeldRefund
) -> None:
    ana, bruno = reviewer("ana"), reviewer("bruno")
    slack_link(Client(), ana, "U0ANA")
    slack_link(Client(), bruno, "U0BRUNO")
    confirmation = held_refund(6_000)
    press(confirmation.pk, "U0ANA")

    press(confirmation.pk, "U0BRUNO")

    told = slack_api.wait_for("chat.postEphemeral")[0].arguments
    assert told["user"] == "U0BRUNO"
    assert "Not decided: It is already" in told["text"]
    assert Refund.objects.count() == 1


def test_a_payload_that_is_not_json_is_a_clear_400(channels: None) -> None:
    body = "payload=%7Bnot-json"

    answer = slack_post(Client(), ACTIONS, body, slack_signed(body))

    assert (answer.status_code, answer.json()["error"]) == (400, "slack_payload_invalid")


def test_the_slack_endpoints_are_off_without_a_signing_secret(db: None) -> None:
    body = "payload=%7B%7D"

    answer = slack_post(Client(), ACTIONS, body, slack_signed(body))

    assert answer.status_code == 404
    assert SecurityEvent.objects.count() == 0


def test_with_the_broker_away_a_press_is_a_503_and_decides_nothing(
    channels: None, held_refund: HeldRefund, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.exceptions import OperationalError

    from approvals import slack

    ana = reviewer("ana")
    slack_link(Client(), ana, "U0ANA")
    confirmation = held_refund(6_000)

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(slack.slack_action_task, "delay", broker_down)

    answer = press(confirmation.pk, "U0ANA")

    assert (answer.status_code, answer.json()["error"]) == (503, "unavailable")
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert Refund.objects.count() == 0

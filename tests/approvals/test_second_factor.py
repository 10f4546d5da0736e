"""A second factor before money moves above a policy's line (factor_above): the decision core
refuses an approval without a fresh one, whichever door it came through; the pages ask for it
on the step-up page, the API in the request itself."""

from __future__ import annotations

import time
from typing import Any

import pytest
from allauth.mfa.app_settings import TOTP_PERIOD
from allauth.mfa.totp.internal.auth import (
    TOTP,
    format_hotp_value,
    generate_totp_secret,
    hotp_value,
)
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

from approvals.errors import FactorRequired
from approvals.reviewers import reviewer_token_create
from approvals.services import confirmation_approve
from dispatch.models import Agent, Confirmation, ConfirmationStatus, SecurityEvent
from tests.approvals.conftest import refund_held_for
from tests.approvals.test_apis import make_user, status_of
from tests.conftest import Ledger, LoginClient, MakeAgent
from tests.factories import OrderFactory

# Committed for real: an approval executes its refund after the commit.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


@pytest.fixture
def strict(make_agent: MakeAgent) -> Agent:
    """Held from 50.00; above 80.00 an approval needs a second factor. CUS-1 has a second order,
    ORD-2001, of 500.00 BRL."""
    OrderFactory.create(order_id="ORD-2001", customer_id="CUS-1", total_cents=50_000)
    return make_agent(factor_above_cents=8_000)[0]


def enrol(user: User) -> str:
    secret = str(generate_totp_secret())
    TOTP.activate(user, secret)
    return secret


def code_of(secret: str) -> str:
    return str(format_hotp_value(hotp_value(secret, int(time.time()) // TOTP_PERIOD)))


def approve(client: Client, confirmation: Confirmation, token: str, **body: Any) -> Any:
    return client.post(
        f"/api/v1/confirmations/{confirmation.pk}/approve",
        body,
        content_type="application/json",
        headers={"Authorization": f"Token {token}"},
    )


def test_the_core_refuses_an_approval_above_the_line_without_a_factor(
    strict: Agent, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_000)

    with pytest.raises(FactorRequired, match="second factor"):
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=make_user("rita"))

    assert status_of(confirmation) == ConfirmationStatus.PENDING
    assert confirmation.votes.count() == 0
    assert ledger.state() == (0, 0)


def test_below_the_line_no_factor_is_asked(strict: Agent, client: Client, ledger: Ledger) -> None:
    confirmation = refund_held_for(strict, 6_000)
    token = reviewer_token_create(user=make_user("rita"))

    response = approve(client, confirmation, token)

    assert response.status_code == 200, response.content
    assert ledger.state() == (1, 6_000)


def test_a_token_without_a_code_is_a_403_with_the_reason_on_record(
    strict: Agent, client: Client, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_000)
    token = reviewer_token_create(user=make_user("rita"))

    response = approve(client, confirmation, token)

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "second_factor_required"
    assert "R$ 80,00" in error["message"].replace("\xa0", " ")
    assert SecurityEvent.objects.filter(status=403, reason="second_factor_required").exists()
    assert status_of(confirmation) == ConfirmationStatus.PENDING
    assert ledger.state() == (0, 0)


def test_a_fresh_code_lets_the_token_approve_once_and_a_reused_one_is_refused(
    strict: Agent, client: Client, ledger: Ledger
) -> None:
    first, second = (
        refund_held_for(strict, 9_000),
        refund_held_for(strict, 9_500, order_id="ORD-2001", session="s-2"),
    )
    rita = make_user("rita")
    secret = enrol(rita)
    token = reviewer_token_create(user=rita)
    code = code_of(secret)

    approved = approve(client, first, token, totp=code)
    reused = approve(client, second, token, totp=code)

    assert approved.status_code == 200, approved.content
    assert reused.status_code == 403
    assert reused.json()["error"]["code"] == "second_factor_invalid"
    assert status_of(second) == ConfirmationStatus.PENDING
    assert ledger.state() == (1, 9_000)


def test_guessed_codes_are_locked_out_like_passwords(
    strict: Agent, client: Client, settings: Settings, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_000)
    rita = make_user("rita")
    secret = enrol(rita)
    token = reviewer_token_create(user=rita)
    wrong = f"{(int(code_of(secret)) + 1) % 1_000_000:06d}"

    answers = [approve(client, confirmation, token, totp=wrong).status_code for _ in range(6)]
    right = approve(client, confirmation, token, totp=code_of(secret))

    assert answers == [403] * (settings.AXES_FAILURE_LIMIT - 1) + [429] * (
        7 - settings.AXES_FAILURE_LIMIT
    )
    assert right.status_code == 429
    assert right.json()["error"]["code"] == "second_factor_locked"
    # The lockout is axes': the password login of that user from that address is locked too.
    assert not LoginClient().login(username="rita", password="pw-rita")
    assert ledger.state() == (0, 0)


def test_the_card_asks_for_a_fresh_factor_and_again_when_it_is_stale(
    strict: Agent, settings: Settings, ledger: Ledger
) -> None:
    first = refund_held_for(strict, 9_000)
    second = refund_held_for(strict, 9_500, order_id="ORD-2001", session="s-2")
    rita = make_user("rita")
    secret = enrol(rita)
    browser = Client()
    browser.force_login(rita)
    card = f"/approvals/{first.pk}/"

    asked = browser.post(f"/approvals/{first.pk}/approve", {"next": card})
    given = browser.post("/approvals/factor/", {"code": code_of(secret), "next": card})
    approved = browser.post(f"/approvals/{first.pk}/approve", {"next": card})
    settings.TOOLGATE_FACTOR_FRESH_SECONDS = -1
    asked_again = browser.post(f"/approvals/{second.pk}/approve")

    assert asked.status_code == 403
    assert "needs your second factor" in asked.content.decode()
    assert (given.status_code, given["Location"]) == (303, card)
    assert approved.status_code == 303
    assert status_of(first) == ConfirmationStatus.EXECUTED
    assert asked_again.status_code == 403
    assert status_of(second) == ConfirmationStatus.PENDING
    assert ledger.state() == (1, 9_000)
    assert SecurityEvent.objects.filter(channel="web", reason="second_factor_required").count() == 2


def test_a_reviewer_without_an_authenticator_is_sent_to_enrol(strict: Agent) -> None:
    confirmation = refund_held_for(strict, 9_000)
    browser = Client()
    browser.force_login(make_user("rita"))

    response = browser.post(f"/approvals/{confirmation.pk}/approve")

    assert response.status_code == 403
    assert 'href="/accounts/2fa/totp/activate/"' in response.content.decode()


def test_an_edit_to_an_amount_still_above_the_line_asks_for_the_factor_and_changes_nothing(
    strict: Agent, client: Client, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_500)
    client.force_login(make_user("rita"))

    response = client.post(
        f"/approvals/{confirmation.pk}/edit", {"amount_cents": "90,00"}, follow=False
    )

    assert response.status_code == 403
    assert SecurityEvent.objects.filter(status=403, reason="second_factor_required").exists()
    assert status_of(confirmation) == ConfirmationStatus.PENDING
    assert not Confirmation.objects.filter(edited_from=confirmation.pk).exists()
    assert ledger.state() == (0, 0)


def test_an_edit_below_the_line_needs_no_factor(
    strict: Agent, client: Client, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_500)
    client.force_login(make_user("rita"))

    client.post(f"/approvals/{confirmation.pk}/edit", {"amount_cents": "70,00"})

    assert status_of(confirmation) == ConfirmationStatus.SUPERSEDED
    assert ledger.state() == (1, 7_000)

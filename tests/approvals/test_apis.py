"""Reviewers approve and reject on the API, with a personal token or a browser session and its
CSRF token; an agent's token never decides anything."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.models import ReviewerToken
from approvals.reviewers import REVIEWERS_GROUP, reviewer_token_create
from dispatch.models import Agent, Confirmation, ConfirmationStatus, SecurityEvent
from tests.approvals.conftest import refund_held_for
from tests.conftest import Ledger, MakeAgent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("orders")]


def make_user(username: str, *, reviewer: bool = True) -> User:
    user = User.objects.create_user(username, password="pw-" + username)
    if reviewer:
        group, _ = Group.objects.get_or_create(name=REVIEWERS_GROUP)
        user.groups.add(group)
    return user


@pytest.fixture
def held(make_agent: MakeAgent) -> tuple[Agent, str, Confirmation]:
    """An agent, its token, and a refund of 6000 of its held for one reviewer."""
    agent, token = make_agent()
    return agent, token, refund_held_for(agent)


def decide(
    client: Client, confirmation_id: str, action: str, token: str | None = None, **body: Any
) -> Any:
    return client.post(
        f"/api/v1/confirmations/{confirmation_id}/{action}",
        body if action == "reject" else None,
        content_type="application/json",
        headers={"Authorization": f"Token {token}"} if token else {},
    )


def status_of(confirmation: Confirmation) -> str:
    return Confirmation.objects.get(pk=confirmation.pk).status


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_an_agent_token_is_refused_and_the_refusal_recorded(
    client: Client, held: tuple[Agent, str, Confirmation], action: str
) -> None:
    agent, token, confirmation = held

    response = decide(client, confirmation.pk, action, token, reason="mine")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert "agent" in response.json()["error"]["message"]
    assert status_of(confirmation) == ConfirmationStatus.PENDING
    event = SecurityEvent.objects.get()
    assert (event.status, event.agent) == (403, agent)


def test_no_credentials_is_a_401(client: Client, held: tuple[Agent, str, Confirmation]) -> None:
    confirmation = held[2]

    response = decide(client, confirmation.pk, "approve")

    assert response.status_code == 401
    assert response.json()["error"]["status"] == 401
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_an_unknown_or_disabled_token_is_a_401(
    client: Client, held: tuple[Agent, str, Confirmation]
) -> None:
    confirmation = held[2]
    user = make_user("rita")
    token = reviewer_token_create(user=user)
    user.is_active = False
    user.save()

    unknown = decide(client, confirmation.pk, "approve", "tgr_nothing")
    disabled = decide(client, confirmation.pk, "approve", token)

    assert (unknown.status_code, disabled.status_code) == (401, 401)
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_a_token_of_someone_not_in_the_reviewers_group_is_a_403(
    client: Client, held: tuple[Agent, str, Confirmation]
) -> None:
    confirmation = held[2]
    token = reviewer_token_create(user=make_user("max", reviewer=False))

    response = decide(client, confirmation.pk, "approve", token)

    assert response.status_code == 403
    assert "reviewers" in response.json()["error"]["message"]
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_an_unknown_confirmation_is_a_404(client: Client) -> None:
    token = reviewer_token_create(user=make_user("rita"))

    response = decide(client, "0" * 32, "approve", token)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, "reason: required"),
        ({"reason": ""}, "reason"),
        ({"reason": 3}, "reason"),
        ({"reason": "x", "amount": 1}, "amount"),
    ],
)
def test_a_reject_without_a_reason_is_a_400(
    client: Client, held: tuple[Agent, str, Confirmation], body: dict[str, Any], expected: str
) -> None:
    confirmation = held[2]
    token = reviewer_token_create(user=make_user("rita"))

    response = decide(client, confirmation.pk, "reject", token, **body)

    assert response.status_code == 400, response.content
    assert expected in response.json()["error"]["message"]
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_a_reject_body_that_is_not_json_is_refused(
    client: Client, held: tuple[Agent, str, Confirmation]
) -> None:
    confirmation = held[2]
    token = reviewer_token_create(user=make_user("rita"))
    url = f"/api/v1/confirmations/{confirmation.pk}/reject"
    auth = {"Authorization": f"Token {token}"}

    broken = client.post(url, "{reason", content_type="application/json", headers=auth)
    form = client.post(url, {"reason": "no"}, headers=auth)
    listed = client.post(url, ["no"], content_type="application/json", headers=auth)

    assert (broken.status_code, form.status_code, listed.status_code) == (400, 415, 400)
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_a_browser_session_without_its_csrf_token_is_refused(
    held: tuple[Agent, str, Confirmation],
) -> None:
    confirmation = held[2]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(make_user("rita"))

    response = browser.post(
        f"/api/v1/confirmations/{confirmation.pk}/approve", content_type="application/json"
    )

    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_a_new_token_replaces_the_old(
    client: Client, held: tuple[Agent, str, Confirmation]
) -> None:
    confirmation = held[2]
    user = make_user("max", reviewer=False)
    old = reviewer_token_create(user=user)

    new = reviewer_token_create(user=user)

    assert decide(client, confirmation.pk, "approve", old).status_code == 401
    assert decide(client, confirmation.pk, "approve", new).status_code == 403
    assert ReviewerToken.objects.get(user=user).token_prefix == new[:10]


# Decisions: committed for real, so that the execution runs in-process after the commit, as in
# the embedded default, and the answer shows its result.
decisions = pytest.mark.django_db(transaction=True)


@decisions
def test_a_reviewer_token_approves_and_the_refund_executes(
    client: Client, held: tuple[Agent, str, Confirmation], ledger: Ledger
) -> None:
    confirmation = held[2]
    token = reviewer_token_create(user=make_user("rita"))

    response = decide(client, confirmation.pk, "approve", token)

    assert response.status_code == 200, response.content
    state = response.json()
    assert state["confirmation_id"] == confirmation.pk
    assert state["status"] == ConfirmationStatus.EXECUTED
    assert state["result"]["ok"] is True
    assert ledger.state() == (1, 6000)


@decisions
def test_a_reviewer_rejects_with_a_reason_that_reaches_the_agent(
    client: Client, held: tuple[Agent, str, Confirmation], ledger: Ledger
) -> None:
    _, agent_token, confirmation = held
    token = reviewer_token_create(user=make_user("rita"))

    response = decide(client, confirmation.pk, "reject", token, reason="Photo shows no damage")
    seen = client.get(
        f"/api/v1/confirmations/{confirmation.pk}", HTTP_AUTHORIZATION=f"Token {agent_token}"
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == ConfirmationStatus.REJECTED
    assert seen.json()["status"] == ConfirmationStatus.REJECTED
    assert "Photo shows no damage" in seen.json()["result"]["message"]
    assert ledger.state() == (0, 0)


@decisions
def test_a_decided_confirmation_cannot_be_decided_again(
    client: Client, held: tuple[Agent, str, Confirmation], ledger: Ledger
) -> None:
    confirmation = held[2]
    first = reviewer_token_create(user=make_user("rita"))
    second = reviewer_token_create(user=make_user("sam"))
    decide(client, confirmation.pk, "reject", first, reason="no")

    approve = decide(client, confirmation.pk, "approve", second)
    reject = decide(client, confirmation.pk, "reject", second, reason="no again")

    assert (approve.status_code, reject.status_code) == (409, 409)
    assert approve.json()["error"]["code"] == "already_decided"
    assert status_of(confirmation) == ConfirmationStatus.REJECTED
    assert ledger.state() == (0, 0)


@decisions
def test_with_two_reviewers_required_the_same_reviewer_cannot_approve_twice(
    client: Client, make_agent: MakeAgent, ledger: Ledger
) -> None:
    agent, _ = make_agent(two_reviewers_from_cents=10_000)
    confirmation = refund_held_for(agent, 11_000)
    rita = reviewer_token_create(user=make_user("rita"))
    sam = reviewer_token_create(user=make_user("sam"))

    vote = decide(client, confirmation.pk, "approve", rita)
    again = decide(client, confirmation.pk, "approve", rita)
    executed_before_sam = ledger.state()
    second = decide(client, confirmation.pk, "approve", sam)

    assert confirmation.reviewers_required == 2
    assert (vote.status_code, vote.json()["status"]) == (200, ConfirmationStatus.PENDING)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "already_voted")
    assert executed_before_sam == (0, 0)
    assert (second.status_code, second.json()["status"]) == (200, ConfirmationStatus.EXECUTED)
    assert ledger.state() == (1, 11_000)


@decisions
def test_a_browser_session_with_its_csrf_token_approves(
    held: tuple[Agent, str, Confirmation], ledger: Ledger
) -> None:
    confirmation = held[2]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(make_user("rita"))
    browser.get("/accounts/login/")
    csrf = browser.cookies["csrftoken"].value

    response = browser.post(
        f"/api/v1/confirmations/{confirmation.pk}/approve",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == ConfirmationStatus.EXECUTED
    assert ledger.state() == (1, 6000)

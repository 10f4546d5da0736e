"""POST /api/v1/confirmations/{id}/withdraw: the agent's host takes back its held call."""

from __future__ import annotations

import pytest
import requests
from django.contrib.auth.models import Group, User

from approvals.services import confirmation_approve
from dispatch.models import Confirmation, Movement, SecurityEvent
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")


def withdraw(api: AgentClient, confirmation_id: str) -> requests.Response:
    return api.toolgate.request(
        "POST", f"/api/v1/confirmations/{confirmation_id}/withdraw", headers=api.headers()
    )


def test_the_host_withdraws_a_held_call(api: AgentClient, ledger: Ledger) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]

    response = withdraw(api, confirmation_id)

    assert response.status_code == 200
    state = response.json()
    assert (state["status"], state["final"]) == ("withdrawn", True)
    assert state["decision_code"] == "WITHDRAWN"
    assert api.get(f"/api/v1/confirmations/{confirmation_id}").json()["status"] == "withdrawn"
    assert not Movement.objects.filter(confirmation_id=confirmation_id, released_at=None).exists()
    assert ledger.state() == (0, 0)


def test_a_withdrawal_after_a_reviewer_approved_is_a_409_and_moves_nothing(
    api: AgentClient, ledger: Ledger
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    reviewer = User.objects.create_user("ana", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    status = Confirmation.objects.get(pk=confirmation_id).status

    response = withdraw(api, confirmation_id)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_approved"
    assert "approved" in response.json()["error"]["message"]
    assert Confirmation.objects.get(pk=confirmation_id).status == status


def test_a_second_withdrawal_is_a_409_already_decided(api: AgentClient) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    withdraw(api, confirmation_id)

    response = withdraw(api, confirmation_id)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_decided"


def test_another_agents_call_is_a_404_like_a_missing_one(
    api: AgentClient, make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    other = client_for(make_agent()[1])

    theirs = withdraw(other, confirmation_id)
    missing = withdraw(other, "0123456789abcdef0123456789abcdef")
    unstorable = withdraw(other, "c%00")

    assert theirs.status_code == missing.status_code == unstorable.status_code == 404
    assert theirs.json() == missing.json()
    assert confirmation_id not in theirs.text
    assert Confirmation.objects.get(pk=confirmation_id).status == "pending"


def test_a_withdrawal_needs_the_agents_token(api: AgentClient, client_for: ClientFor) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]

    response = withdraw(client_for(None), confirmation_id)

    assert response.status_code == 401
    assert Confirmation.objects.get(pk=confirmation_id).status == "pending"
    assert SecurityEvent.objects.filter(status=401).exists()

"""The queue's list through Django's test client: a row a held call with what the card says
first, its refresh, its empty state, and who may open it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dispatch.models import Confirmation
from tests.approvals.conftest import HoldRefund, MakeUser
from tests.approvals.test_pages import text

pytestmark = pytest.mark.django_db


def test_a_row_says_amount_what_customer_why_expiry_and_approvals(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)

    response = client.get("/approvals/list/")

    content = response.content.decode()
    row = text(response).split("Approvals", 3)[-1]
    assert f'id="row-{held.pk}"' in content
    assert "R$ 60,00 Refund order · ORD-1001 CUS-1" in row
    assert "R$ 60,00 is not below R$ 50,00, the most this agent may refund without a human" in row
    assert "0 of 1" in row
    assert f'href="/approvals/{held.pk}/"' in content
    assert f'action="/approvals/{held.pk}/approve"' in content
    assert 'name="csrfmiddlewaretoken"' in content


def test_a_call_that_asks_more_than_a_click_opens_its_card_from_the_list(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    first = hold_refund(6_000, session_id="chat-1")
    twin = hold_refund(6_000, session_id="chat-2")
    assert twin.duplicate_of
    client.force_login(reviewer)

    content = client.get("/approvals/list/").content.decode()

    assert f'action="/approvals/{twin.pk}/approve"' not in content
    assert f'<a href="/approvals/{twin.pk}/" class="open"' in content
    assert f'action="/approvals/{first.pk}/approve"' in content


def test_the_list_refresh_says_which_shown_row_someone_else_settled(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    gone = hold_refund(6_000)
    staying = hold_refund(7_000)
    Confirmation.objects.filter(pk=gone.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.force_login(reviewer)

    response = client.get(
        "/approvals/list/", {"shown": [gone.pk, staying.pk]}, headers={"HX-Request": "true"}
    )

    content = response.content.decode()
    assert "<html" not in content
    assert "R$ 60,00 ORD-1001 is no longer waiting" in text(response)
    assert f'id="row-{staying.pk}"' in content and f'id="row-{gone.pk}"' not in content


def test_an_empty_list_says_what_will_appear(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)

    page = text(client.get("/approvals/list/"))

    assert re.search(r"No [a-z, ]+ are waiting for a decision\.", page)
    assert "it appears here as a row" in page


def test_the_list_is_for_reviewers_only(client: Client, make_user: MakeUser) -> None:
    client.force_login(make_user("max", "managers"))

    assert client.get("/approvals/list/").status_code == 403
    client.logout()
    assert client.get("/approvals/list/").status_code == 302

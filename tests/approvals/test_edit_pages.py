"""Edit and approve on the card: the form shows only what the tool lets a reviewer change, with
its rule; it needs its CSRF token; what it refuses is said in words and changes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import QueryDict
from django.test import Client

from approvals.forms import EditInvalid, edit_changes
from approvals.selectors import EditField
from dispatch.models import Confirmation, ConfirmationStatus, Movement
from orders.models import Refund
from tests.approvals.conftest import HoldRefund
from tests.approvals.test_pages import text

pytestmark = pytest.mark.django_db


def edit_form(page: str, confirmation_id: str) -> str:
    found = re.search(
        rf'<form method="post" action="/approvals/{confirmation_id}/edit">(.*?)</form>',
        page,
        re.S,
    )
    assert found, "no edit form on the card"
    return found.group(1)


def untouched(held: Confirmation) -> None:
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING
    assert Confirmation.objects.count() == 1
    assert list(
        Movement.objects.filter(released_at=None).values_list("amount_cents", flat=True)
    ) == [held.amount_cents]
    assert not Refund.objects.exists()


def test_the_card_offers_only_the_amount_with_its_rule_in_the_orders_currency(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(8_000)
    client.force_login(reviewer)

    page = client.get("/approvals/").content.decode()

    form = edit_form(page, held.pk)
    assert 'name="amount_cents" value="80.00"' in form
    assert "may only fall" in form
    assert 'name="csrfmiddlewaretoken"' in form
    for frozen in ("order_id", "currency", "reason"):
        assert f'name="{frozen}"' not in form


def test_a_reviewer_approves_less_than_asked_from_the_card(
    client: Client,
    reviewer: User,
    hold_refund: HoldRefund,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    held = hold_refund(8_000)
    client.force_login(reviewer)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/approvals/{held.pk}/edit",
            {"amount_cents": "60,00", "next": f"/approvals/{held.pk}/"},
            follow=True,
        )

    edited = Confirmation.objects.get(edited_from=held.pk)
    assert response.redirect_chain[-1][0] == f"/approvals/{edited.pk}/"
    assert edited.status == ConfirmationStatus.EXECUTED
    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [6_000]
    page = text(response)
    assert "Edited before approval" in page
    assert "amount_cents 8000 → 6000" in page


@pytest.mark.parametrize(
    ("posted", "words"),
    [
        ({"amount_cents": "90.00"}, "9000 is more than the 8000 asked"),
        ({"amount_cents": "80.00"}, "Nothing was changed"),
        ({"amount_cents": "sixty"}, "is not an amount"),
        ({"amount_cents": "60.001"}, "finer than its smallest unit"),
        ({"amount_cents": "0"}, "does not fit its schema"),
        ({"amount_cents": "60.00", "order_id": "ORD-1002"}, "order_id cannot be changed"),
        ({"amount_cents": ""}, "give a value"),
    ],
)
def test_a_refused_edit_says_why_and_changes_nothing(
    posted: dict[str, str],
    words: str,
    client: Client,
    reviewer: User,
    hold_refund: HoldRefund,
) -> None:
    held = hold_refund(8_000)
    client.force_login(reviewer)

    response = client.post(f"/approvals/{held.pk}/edit", posted, follow=True)

    assert response.status_code == 200
    assert words in text(response)
    untouched(held)


def test_an_edit_needs_the_csrf_token(reviewer: User, hold_refund: HoldRefund) -> None:
    held = hold_refund(8_000)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(reviewer)

    response = browser.post(f"/approvals/{held.pk}/edit", {"amount_cents": "60.00"})

    assert response.status_code == 403
    untouched(held)


def test_an_edit_is_posted_not_fetched(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(8_000)
    client.force_login(reviewer)

    response = client.get(f"/approvals/{held.pk}/edit?amount_cents=60.00")

    assert response.status_code == 405
    untouched(held)


@pytest.mark.parametrize("kept", [["7"], ["x"], ["-1"]])
def test_a_list_edit_offers_only_the_entries_asked(kept: list[str]) -> None:
    field = EditField("item_ids", "item ids", "may only shrink", "list", entries=((0, "a"),))
    data = QueryDict(mutable=True)
    data.setlist("item_ids", kept)

    with pytest.raises(EditInvalid, match="choose among the entries asked"):
        edit_changes(data, [field], {"item_ids": ["a"]})


def test_a_list_edit_keeps_the_entries_left_ticked_in_their_order() -> None:
    field = EditField("item_ids", "item ids", "may only shrink", "list")
    data = QueryDict(mutable=True)
    data.setlist("item_ids", ["2", "0"])

    assert edit_changes(data, [field], {"item_ids": ["a", "b", "c"]}) == {"item_ids": ["a", "c"]}

"""What the pages showed wrongly, shown right: an amount's currency as it is written, a
cancellation's reason in money's words, the order's date where its facts are listed, and the
approvals so far in one plain sentence."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.models import ReviewerLimit
from dispatch.models import ConfirmationStatus
from tests.approvals.conftest import HoldRefund, MakeUser
from tests.approvals.test_pages import text
from tests.conftest import confirmation_rewrite
from tests.factories import OrderFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def large_order(db: None) -> None:
    OrderFactory.create(order_id="ORD-3002", customer_id="CUS-1", total_cents=100_000)


def test_the_timeline_writes_the_amount_still_needed_with_its_currency_as_it_is(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund, large_order: None
) -> None:
    held = hold_refund(25_000, order_id="ORD-3002")
    junior = make_user("june", "reviewers")
    ReviewerLimit.objects.create(reviewer=junior, currency="BRL", max_amount_cents=10_000)
    client.force_login(reviewer)

    page = text(client.get(f"/records/confirmations/{held.pk}/"))

    assert "Waiting for 2 reviewers: needs approvals from 2 different reviewers" in page
    assert "a limit that covers R$ 250,00" in page
    assert "r$" not in page


def test_the_confirmation_and_reconciliation_pages_show_when_the_order_was_placed(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)

    record = client.get(f"/records/confirmations/{held.pk}/").content.decode()
    confirmation_rewrite(held.pk, status=ConfirmationStatus.UNKNOWN, decided_at=timezone.now())
    reconciliation = client.get("/approvals/reconciliation/").content.decode()

    assert re.search(r"<dt>Ordered</dt><dd><time datetime=", record)
    assert re.search(r"<dt>Ordered now</dt><dd><time datetime=", reconciliation)


def test_the_approvals_so_far_read_as_one_sentence_when_none_of_two_is_in(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund, large_order: None
) -> None:
    hold_refund(25_000, order_id="ORD-3002")
    junior = make_user("june", "reviewers")
    ReviewerLimit.objects.create(reviewer=junior, currency="BRL", max_amount_cents=10_000)
    client.force_login(junior)

    page = text(client.get("/approvals/"))

    assert (
        "Approvals None of the 2 needed yet. Needs approvals from 2 different reviewers, one of "
        "whom has a limit that covers R$ 250,00 (rita). No approval limit in BRL: rita." in page
    )
    assert " 0 of 2 ." not in page

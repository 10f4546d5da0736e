"""The records pages (confirmations, security events, orders with their refunds) as each role
reads them: who may open what, the filters in the URL, pagination, empty states, amounts as
people write them, and a bounded number of queries however many rows a page lists."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.services import confirmation_reject
from dispatch.models import Confirmation, SecurityEvent
from tests.approvals.conftest import HoldRefund, MakeUser
from tests.conftest import confirmation_rewrite
from tests.factories import OrderFactory
from tests.records.conftest import Books, as_user, refused

pytestmark = pytest.mark.django_db


def page(client: Client, path: str, **params: str) -> str:
    response = client.get(path, params)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


# Who may open what -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "for_reviewer", "for_manager"),
    [
        ("/records/confirmations/", 403, 200),
        ("/records/confirmations/{pending}/", 200, 200),
        ("/records/security/", 403, 200),
        ("/records/orders/", 200, 200),
        ("/records/orders/ORD-1001/", 200, 200),
        ("/analytics/calls/", 403, 200),
    ],
)
def test_each_record_opens_to_its_readers_only(
    books: Books,
    reviewer: User,
    manager: User,
    make_user: MakeUser,
    path: str,
    for_reviewer: int,
    for_manager: int,
) -> None:
    path = path.format(pending=books.pending.pk)
    # A superuser outside both groups reads none of them: the groups are the only way in.
    admin = make_user("ada", is_staff=True, is_superuser=True)

    assert as_user(reviewer).get(path).status_code == for_reviewer
    assert as_user(manager).get(path).status_code == for_manager
    assert as_user(admin).get(path).status_code == 403
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")


def test_the_records_are_read_only(books: Books, manager: User) -> None:
    client = as_user(manager)

    for path in ("/records/confirmations/", f"/records/confirmations/{books.pending.pk}/"):
        assert client.post(path).status_code == 405

    assert Confirmation.objects.get(pk=books.pending.pk).status == "pending"


def test_unknown_records_are_404(books: Books, manager: User) -> None:
    client = as_user(manager)

    assert client.get("/records/confirmations/0123456789abcdef/").status_code == 404
    assert client.get("/records/orders/ORD-9999/").status_code == 404


# Confirmations ---------------------------------------------------------------------------------


def test_the_confirmations_list_every_state_with_amounts_for_people(
    books: Books, manager: User, hold_refund: HoldRefund, reviewer: User
) -> None:
    OrderFactory.create(order_id="ORD-1003", customer_id="CUS-3", total_cents=9_000, currency="USD")
    rejected = hold_refund(5_500, order_id="ORD-1003", currency="USD", customer_id="CUS-3")
    confirmation_reject(confirmation_id=rejected.pk, reviewer=reviewer, reason="Not returned.")

    html = page(as_user(manager), "/records/confirmations/")

    for status in ("Executed", "Pending", "Rejected"):
        assert status in html
    assert "R$\xa050,00" in html and "$55.00" in html
    assert ">5000<" not in html
    assert f'href="/records/confirmations/{books.pending.pk}/"' in html


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"status": "pending"}, {"pending"}),
        ({"status": "executed"}, {"approved"}),
        ({"customer": "CUS-1"}, {"pending", "approved"}),
        ({"customer": "CUS-9"}, set()),
        ({"tool": "refund_order"}, {"pending", "approved"}),
    ],
)
def test_the_confirmations_filter_by_the_query_string(
    books: Books, manager: User, params: dict[str, str], shown: set[str]
) -> None:
    response = as_user(manager).get("/records/confirmations/", params)

    listed = {row.record.pk for row in response.context["table"].paginated_rows}
    names = {"pending": books.pending.pk, "approved": books.approved.pk}
    assert listed == {names[name] for name in shown}


def test_the_confirmations_filter_by_the_day_they_were_held(books: Books, manager: User) -> None:
    confirmation_rewrite(books.approved.pk, created_at=timezone.now() - timedelta(days=10))
    today = timezone.localdate().isoformat()

    response = as_user(manager).get("/records/confirmations/", {"created_after": today})

    assert [row.record.pk for row in response.context["table"].paginated_rows] == [books.pending.pk]


def test_a_confirmation_shows_its_timeline_and_links_to_what_explains_it(
    books: Books, manager: User
) -> None:
    html = page(as_user(manager), f"/records/confirmations/{books.approved.pk}/")

    assert "rita" in html and "approved" in html and "executed it" in html
    assert 'href="/records/orders/ORD-1001/"' in html
    assert f'href="/analytics/sessions/{books.agent.pk}/{books.approved.session_id}/"' in html
    assert re.search(r'href="/analytics/calls/[0-9a-f]+/"', html)
    # Read-only: no form that decides it.
    assert "/approve" not in html and "/reject" not in html


def test_a_reviewer_reading_a_pending_confirmation_is_sent_to_decide_it_in_the_queue(
    books: Books, reviewer: User
) -> None:
    html = page(as_user(reviewer), f"/records/confirmations/{books.pending.pk}/")

    assert f'href="/approvals/{books.pending.pk}/"' in html
    # Their way back is their history: the managers' list is not theirs.
    assert 'href="/approvals/history/"' in html and 'href="/records/confirmations/"' not in html


def test_the_confirmations_say_what_will_appear_when_there_is_none(manager: User, db: None) -> None:
    html = page(as_user(manager), "/records/confirmations/")
    filtered = page(as_user(manager), "/records/confirmations/", status="pending")

    assert "No call has been held for a human yet" in html
    assert "No confirmation matches these filters" in filtered


# Security events -------------------------------------------------------------------------------


def test_the_security_events_list_and_count_refused_requests(manager: User) -> None:
    refused(Client(), 3)
    refused(Client(), 1, address="198.51.100.9")

    response = as_user(manager).get("/records/security/")
    html = response.content.decode()

    assert response.context["counts"][0]["events"] == 4
    assert "authentication_failed" in html and "203.0.113.7" in html
    assert response.context["table"].paginator.count == 4


def test_the_security_events_filter_by_address_reason_and_day(manager: User) -> None:
    refused(Client(), 2)
    SecurityEvent.objects.create(
        at=timezone.now() - timedelta(days=3),
        client_address="198.51.100.9",
        method="POST",
        path="/api/v1/calls",
        status=413,
        reason="payload_too_large",
    )
    client = as_user(manager)

    by_address = client.get("/records/security/", {"address": "198.51.100.9"})
    by_reason = client.get("/records/security/", {"reason": "payload_too_large"})
    by_day = client.get("/records/security/", {"at_after": timezone.localdate().isoformat()})
    nothing = client.get("/records/security/", {"reason": "throttled"})

    assert by_address.context["table"].paginator.count == 1
    assert by_reason.context["table"].paginator.count == 1
    assert by_day.context["table"].paginator.count == 2
    assert "No refused request matches these filters" in nothing.content.decode()


def test_the_security_events_page_by_fifty(manager: User) -> None:
    now = timezone.now()
    SecurityEvent.objects.bulk_create(
        SecurityEvent(
            at=now - timedelta(seconds=n),
            method="POST",
            path="/api/v1/calls",
            status=401,
            reason="authentication_failed",
        )
        for n in range(60)
    )
    client = as_user(manager)

    first = client.get("/records/security/")
    second = client.get("/records/security/", {"page": 2})

    assert len(first.context["table"].page.object_list) == 50
    assert len(second.context["table"].page.object_list) == 10
    assert "Page 1 of 2" in first.content.decode()
    assert 'href="?page=2"' in first.content.decode()


def test_no_security_event_says_what_will_appear(manager: User) -> None:
    assert "No request has been refused" in page(as_user(manager), "/records/security/")


# Orders and their refunds ----------------------------------------------------------------------


def test_an_order_shows_the_refunds_behind_already_refunded(books: Books, reviewer: User) -> None:
    response = as_user(reviewer).get("/records/orders/ORD-1001/")
    html = response.content.decode()

    rows = response.context["refund_rows"]
    assert [(row.amount, row.approved_by) for row in rows] == [
        ("R$\xa020,00", "policy"),
        ("R$\xa050,00", "rita"),
    ]
    assert [row.refunded_after for row in rows] == ["R$\xa020,00", "R$\xa070,00"]
    assert "Already refunded" in html and "R$\xa070,00" in html
    assert "Still refundable" in html and "R$\xa050,00" in html
    # The reviewer's approval links to their own page of it; each refund to its session.
    assert f'href="/approvals/{books.approved.pk}/"' in html
    assert 'href="/analytics/sessions/' in html


def test_an_order_shows_what_is_waiting_for_a_reviewer(books: Books, manager: User) -> None:
    response = as_user(manager).get("/records/orders/ORD-1001/")
    html = response.content.decode()

    assert [row.confirmation.pk for row in response.context["waiting"]] == [books.pending.pk]
    assert "R$\xa050,00 in 1 held call" in html
    # A manager reads it on the records' page.
    assert f'href="/records/confirmations/{books.pending.pk}/"' in html


def test_the_orders_list_and_filter(books: Books, manager: User) -> None:
    client = as_user(manager)

    every = client.get("/records/orders/")
    refunded = client.get("/records/orders/", {"refunded": "yes"})
    of_cus2 = client.get("/records/orders/", {"customer": "CUS-2"})
    in_usd = client.get("/records/orders/", {"currency": "USD"})

    def listed(response: object) -> list[str]:
        return [row.record.order_id for row in response.context["table"].paginated_rows]  # type: ignore[attr-defined]

    assert sorted(listed(every)) == ["ORD-1001", "ORD-1002"]
    assert listed(refunded) == ["ORD-1001"]
    assert listed(of_cus2) == ["ORD-1002"] == listed(in_usd)
    html = every.content.decode()
    assert "R$\xa0120,00" in html and "R$\xa070,00" in html and "$45.00" in html


def test_no_order_says_what_will_appear(manager: User, db: None) -> None:
    assert "No orders yet" in page(as_user(manager), "/records/orders/")
    assert "Nothing refunded yet" not in page(as_user(manager), "/records/orders/")


def test_an_order_without_refunds_says_so(manager: User, db: None) -> None:
    OrderFactory.create(order_id="ORD-4001", customer_id="CUS-4", total_cents=1_000)

    html = page(as_user(manager), "/records/orders/ORD-4001/")

    assert "Nothing refunded yet" in html and "No call on this order was held" in html


# Queries: a list costs the same whatever its length --------------------------------------------


def queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def test_the_lists_read_a_bounded_number_of_queries(
    books: Books, manager: User, hold_refund: HoldRefund
) -> None:
    client = as_user(manager)
    paths = (
        "/records/confirmations/",
        "/records/orders/",
        "/records/security/",
        "/records/orders/ORD-1001/",
    )
    refused(Client(), 2)
    few = {path: queries(client, path) for path in paths}

    for n in range(12):
        OrderFactory.create(order_id=f"ORD-5{n:03}", customer_id=f"CUS-5{n}", total_cents=90_000)
        hold_refund(6_000, order_id=f"ORD-5{n:03}", customer_id=f"CUS-5{n}")
    refused(Client(), 12)
    many = {path: queries(client, path) for path in paths}

    assert many == few


# The layout ------------------------------------------------------------------------------------


def test_the_browser_s_icon_request_finds_the_layout_s_icon(client: Client) -> None:
    response = client.get("/favicon.ico")

    assert response.status_code == 302
    assert response["Location"].endswith("/toolgate/favicon.svg")
    assert 'rel="icon"' in client.get("/accounts/login/").content.decode()


def test_the_navigation_folds_behind_a_menu_button_on_a_phone(reviewer: User) -> None:
    html = page(as_user(reviewer), "/approvals/")

    assert 'aria-controls="nav-places"' in html and 'id="nav-places"' in html
    # The keyboard hint is a piece of its own, which a phone's width hides.
    assert '<span class="keys-hint">' in html

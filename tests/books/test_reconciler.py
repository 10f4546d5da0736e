"""The books checked while the system runs (books/reconciler.py, docs/books.md), on PostgreSQL.

A clean system, made through the pipeline and the approvals as in production, reports nothing.
Each invariant is then broken twice: by a direct UPDATE as the tables' owner (triggers off), which
leaves no new row behind, so only the full sweep finds it; and by a new row, which the run over
what changed finds.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from approvals.deciding import confirmation_approve
from approvals.models import ReviewerLimit
from books.models import Breach
from books.reconciler import books_check
from dispatch.models import Agent, Confirmation, ConfirmationStatus, SecurityEvent
from dispatch.services import call_dispatch
from orders.models import Order
from retail.models import Operation, Payment, RetailOrder, RetailUser
from tests.conftest import MakeAgent
from tests.factories import OrderFactory
from toolgate.celery import app as celery_app

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: the books' checks are PostgreSQL statements",
)

INVARIANTS = [
    "order_ledger",
    "retail_refund_beyond_payment",
    "execution_ledger",
    "customer_window",
    "approver_limit",
]


@dataclass
class World:
    agent: Agent
    executed: Confirmation
    pending: Confirmation
    order: Order
    retail_order: RetailOrder


def refund(agent: Agent, order_id: str, amount_cents: int, session: str) -> dict[str, Any]:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="refund_order",
        arguments={
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": "BRL",
            "reason": "damaged",
        },
    ).as_dict()


@pytest.fixture
def world(make_agent: MakeAgent, django_capture_on_commit_callbacks: Any) -> World:
    """A refund moved without a human, one held and approved within its approver's limit and
    executed, one held and pending; a retail order paid and partly refunded."""
    agent = make_agent()[0]
    order = OrderFactory.create(order_id="ORD-1001", customer_id="CUS-1", total_cents=12_000)
    other = OrderFactory.create(order_id="ORD-1003", customer_id="CUS-1", total_cents=12_000)
    reviewer = User.objects.create_user("rita", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    ReviewerLimit.objects.create(reviewer=reviewer, currency="BRL", max_amount_cents=15_000)

    assert refund(agent, order.order_id, 1_000, "s-1")["code"] == "OK"
    held = refund(agent, order.order_id, 6_000, "s-2")
    # The approved refund executes once its approval commits.
    with django_capture_on_commit_callbacks(execute=True):
        executed = confirmation_approve(
            confirmation_id=held["data"]["confirmation_id"], reviewer=reviewer
        )
    pending = refund(agent, other.order_id, 5_500, "s-3")

    user = RetailUser.objects.create(
        user_id="ana_1", first_name="Ana", last_name="S", email="a@example.com",
        address1="1 Rua", city="Rio", state="RJ", country="BR", zip="20000",
    )  # fmt: skip
    retail_order = RetailOrder.objects.create(
        order_id="#W1", user=user, user_position=0, address1="1 Rua", city="Rio", state="RJ",
        country="BR", zip="20000", status="delivered",
    )  # fmt: skip
    # Payments are written with the operation that records them, as the database asks.
    with transaction.atomic():
        Payment.objects.create(
            order=retail_order, position=0, transaction_type="payment", amount_cents=5_000,
            payment_method_id="gift_card_1",
        )  # fmt: skip
        Payment.objects.create(
            order=retail_order, position=1, transaction_type="refund", amount_cents=2_000,
            payment_method_id="gift_card_1",
        )  # fmt: skip
        Operation.objects.create(
            idempotency_key="books-test-payments", tool="test", subject="#W1", result={}
        )
    executed.refresh_from_db()
    assert executed.status == ConfirmationStatus.EXECUTED
    return World(
        agent=agent,
        executed=executed,
        pending=Confirmation.objects.get(pk=pending["data"]["confirmation_id"]),
        order=order,
        retail_order=retail_order,
    )


def as_owner(statement: str, params: list[Any] | None = None) -> None:
    """Test set-up only: change the books as the tables' owner can, every trigger off (the
    lifecycle's, the reservations' protocol, any guard) for the statement."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(statement, params or [])
        finally:
            cursor.execute("SET session_replication_role = origin")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def found_invariants(*, full: bool) -> set[str]:
    return {item.invariant for item in books_check(full=full).found}


@pytest.fixture
def checked(world: World) -> Iterator[World]:
    """The world, checked twice over what changed: the marks stand past every row."""
    books_check()
    books_check()
    yield world


@on_postgresql
def test_a_clean_system_reports_nothing(world: World) -> None:
    full = books_check(full=True)
    changed = books_check()

    assert full.found == [] and changed.found == []
    assert not Breach.objects.exists()
    assert not SecurityEvent.objects.filter(reason__startswith="books_").exists()


def _tampers(world: World) -> dict[str, tuple[str, list[Any]]]:
    """Each invariant broken by an UPDATE: no new row anywhere."""
    return {
        "order_ledger": (
            "UPDATE orders_order SET refunded_cents = 0 WHERE id = %s",
            [world.order.pk],
        ),
        "retail_refund_beyond_payment": (
            "UPDATE retail_payment SET amount_cents = 9000 WHERE order_id = %s AND position = 1",
            [world.retail_order.pk],
        ),
        "execution_ledger": (
            "UPDATE dispatch_confirmation SET status = 'executed' WHERE id = %s",
            [world.pending.pk],
        ),
        "customer_window": (
            "UPDATE dispatch_movement SET amount_cents = 5000 WHERE approval = 'policy'",
            [],
        ),
        "approver_limit": ("UPDATE approvals_reviewerlimit SET max_amount_cents = 100", []),
    }


@on_postgresql
@pytest.mark.parametrize("invariant", INVARIANTS)
def test_a_tampering_update_is_found_by_the_full_sweep(checked: World, invariant: str) -> None:
    as_owner(*_tampers(checked)[invariant])

    over_changes = found_invariants(full=False)
    swept = books_check(full=True)

    assert over_changes == set()
    assert {item.invariant for item in swept.found} == {invariant}
    assert swept.new == 1
    breach = Breach.objects.get()
    assert (breach.invariant, breach.by_sweep) == (invariant, True)
    assert breach.look_at.startswith("/records/")
    event = SecurityEvent.objects.get(reason=f"books_{invariant}")
    assert event.channel == "books" and breach.subject in event.detail


def _changes(world: World) -> dict[str, tuple[str, list[Any]]]:
    """Each invariant broken by a new row, as a path that skipped a check would write it."""
    refund_row = """
        INSERT INTO orders_refund (order_id, idempotency_key, amount_cents, currency, reason,
            approval, approved_by, refunded_cents_after, created_at)
        VALUES (%s, %s, 500, 'BRL', 'damaged', 'policy', '', 7500, now())
    """
    return {
        "order_ledger": (refund_row, [world.order.pk, "k-extra"]),
        "retail_refund_beyond_payment": (
            "INSERT INTO retail_payment (order_id, position, transaction_type, amount_cents, "
            "payment_method_id) VALUES (%s, 2, 'refund', 4000, 'gift_card_1')",
            [world.retail_order.pk],
        ),
        # A ledger row under the execution key of a confirmation still pending.
        "execution_ledger": (refund_row, [world.order.pk, world.pending.execution_key]),
        "customer_window": (
            """
            INSERT INTO dispatch_movement (key, agent_id, session_id, customer_id, currency, tool,
                subject, amount_cents, approval, at, day, confirmation_id)
            VALUES ('k-window', %s, 's-9', 'CUS-1', 'BRL', 'refund_order', 'ORD-1003', 4500,
                'policy', clock_timestamp(), current_date, '')
            """,
            [world.agent.pk],
        ),
        "approver_limit": (
            """
            INSERT INTO approvals_confirmationevent (confirmation_id, at, kind, actor_label,
                message, data, chain_hash, chain_mac)
            VALUES (%s, now(), 'approved', 'rita', '', '{"sum_cents": 90000}', '', '')
            """,
            [world.executed.pk],
        ),
    }


@on_postgresql
@pytest.mark.parametrize("invariant", INVARIANTS)
def test_a_new_row_breaking_the_books_is_found_by_the_run_over_what_changed(
    checked: World, invariant: str
) -> None:
    as_owner(*_changes(checked)[invariant])

    found = books_check()

    assert invariant in {item.invariant for item in found.found}
    breach = Breach.objects.get(invariant=invariant)
    assert breach.by_sweep is False
    # Found once: the next run, reading the same rows again, reports it no more.
    again = books_check()
    assert again.new == 0
    assert SecurityEvent.objects.filter(reason=f"books_{invariant}").count() == 1


@on_postgresql
def test_the_run_over_what_changed_reads_each_new_row_twice_then_no_more(checked: World) -> None:
    as_owner(*_changes(checked)["order_ledger"])

    runs = [found_invariants(full=False) for _ in range(3)]

    assert runs == [{"order_ledger"}, {"order_ledger"}, set()]


@on_postgresql
def test_check_books_prints_each_check_and_exits_1_on_a_breach(checked: World) -> None:
    clean = io.StringIO()
    call_command("check_books", "--full", stdout=clean)
    as_owner(*_tampers(checked)["order_ledger"])
    broken = io.StringIO()

    with pytest.raises(SystemExit) as exited:
        call_command("check_books", "--full", stdout=broken)

    assert "order_ledger: ok" in clean.getvalue() and "0 breach(es)" in clean.getvalue()
    assert exited.value.code == 1
    assert "BREACH order_ledger: order ORD-1001" in broken.getvalue()
    assert "order_ledger: 1 breach(es)" in broken.getvalue()


def test_beat_checks_the_books_over_what_changed_and_sweeps_them_in_full() -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE

    assert schedule["check-books"]["task"] == "books.tasks.books_check_task"
    assert schedule["sweep-books"]["task"] == "books.tasks.books_check_task"
    assert schedule["sweep-books"]["kwargs"] == {"full": True}
    assert schedule["check-books"]["schedule"] < schedule["sweep-books"]["schedule"]
    celery_app.loader.import_default_modules()
    assert "books.tasks.books_check_task" in celery_app.tasks


@on_postgresql
def test_the_books_task_reports_what_it_found(checked: World) -> None:
    from books.tasks import books_check_task

    as_owner(*_tampers(checked)["customer_window"])

    assert books_check_task.delay(full=True).get() == {"found": 1, "new": 1}


@on_postgresql
def test_administrators_see_the_breaches_and_others_do_not(checked: World) -> None:
    as_owner(*_tampers(checked)["order_ledger"])
    books_check(full=True)
    admin = User.objects.create_user("ada", password="pw", is_staff=True)
    reviewer = User.objects.get(username="rita")
    client = Client()

    anonymous = client.get(reverse("books:breaches"))
    client.force_login(reviewer)
    refused = client.get(reverse("books:breaches"))
    client.force_login(admin)
    page = client.get(reverse("books:breaches"))

    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]
    assert refused.status_code == 403
    assert page.status_code == 200
    html = page.content.decode()
    assert "order ORD-1001" in html and reverse("records:order", args=["ORD-1001"]) in html


@pytest.mark.django_db
def test_the_page_says_when_this_database_is_not_one_the_books_are_checked_on() -> None:
    admin = User.objects.create_user("ada", password="pw", is_staff=True)
    client = Client()
    client.force_login(admin)

    html = client.get(reverse("books:breaches")).content.decode()

    checked_here = connection.vendor == "postgresql"
    assert ("not checked on this database" in html) is not checked_here
    assert ("Not checked yet." in html) is checked_here

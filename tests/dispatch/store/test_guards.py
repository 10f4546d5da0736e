"""The database's own guards (PostgreSQL): a confirmation's lifecycle, the reservations' protocol
and the bounded prune of security events, each as installed, against its declaration."""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from dispatch.models import (
    CONFIRMATION_FINAL,
    CONFIRMATION_FROZEN,
    CONFIRMATION_LIFECYCLE,
    Agent,
    Confirmation,
    ConfirmationStatus,
    Movement,
    SecurityEvent,
)
from dispatch.store.guards import (
    CONFIRMATION_LIFECYCLE_FUNCTION,
    MOVEMENT_PROTOCOL_FUNCTION,
    PRUNE_FUNCTION,
    SECURITY_EVENTS_MIN_ROWS,
    SECURITY_EVENTS_PRUNE_BATCH,
    SECURITY_EVENTS_PRUNE_MAX_BATCHES,
    guards_fingerprint,
    guards_sql,
)
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.usefixtures("_postgresql_only")

_ids = itertools.count(1)


@pytest.fixture
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the guards are PostgreSQL triggers; SQLite has none")


def test_the_latest_migration_that_installs_the_guards_installs_them_as_declared_today() -> None:
    """A declaration changed (a status, a frozen column, the protocol, a floor) needs a migration
    that installs the guards again: a database migrated before would keep the old ones."""
    package = importlib.import_module("dispatch.migrations")
    recorded = [
        (name, module.GUARDS_FINGERPRINT)
        for name in sorted(info.name for info in pkgutil.iter_modules(package.__path__))
        for module in [importlib.import_module(f"dispatch.migrations.{name}")]
        if hasattr(module, "GUARDS_FINGERPRINT")
    ]

    assert recorded, "no migration installs the guards"
    assert recorded[-1][1] == guards_fingerprint(), (
        f"the guards render differently from what {recorded[-1][0]} installed: add a migration "
        "that calls guards_install and records the new guards_fingerprint()"
    )


def _confirmation(agent: Agent, status: str = ConfirmationStatus.PENDING) -> Confirmation:
    now = timezone.now()
    n = next(_ids)
    return Confirmation.objects.create(
        id=f"cf-guard-{n}",
        key=f"key-{n}",
        tool="refund_order",
        arguments={"order_id": "ORD-1001", "amount_cents": 6000, "currency": "BRL"},
        arguments_hash="h",
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        policy_version=1,
        amount_cents=6000,
        currency="BRL",
        status=status,
        created_at=now,
        expires_at=now + timedelta(hours=24),
    )


# What the guards raise: a refused change (a trigger), a prune asked to widen what is due.
INSUFFICIENT_PRIVILEGE = "42501"
INVALID_PARAMETER_VALUE = "22023"


def _refused(update: Callable[[], Any], sqlstate: str = INSUFFICIENT_PRIVILEGE) -> bool:
    try:
        with transaction.atomic():
            update()
    except DatabaseError as exc:
        assert getattr(exc.__cause__, "sqlstate", None) == sqlstate, exc
        return True
    return False


def test_the_lifecycle_declares_every_status_and_only_them() -> None:
    assert set(CONFIRMATION_LIFECYCLE) == set(ConfirmationStatus)
    assert all(
        following <= set(ConfirmationStatus) for following in CONFIRMATION_LIFECYCLE.values()
    )
    assert {
        "executed",
        "failed",
        "rejected",
        "expired",
        "invalidated",
        "withdrawn",
        "superseded",
    } == CONFIRMATION_FINAL


@postgresql_only
def test_the_trigger_allows_exactly_the_moves_the_lifecycle_declares(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    allowed = set()

    for before, after in itertools.product(ConfirmationStatus, repeat=2):
        held = _confirmation(agent, before)
        if not _refused(
            lambda: Confirmation.objects.filter(pk=held.pk).update(status=after)  # noqa: B023
        ):
            allowed.add((before.value, after.value))

    declared = {
        (before, after)
        for before, following in CONFIRMATION_LIFECYCLE.items()
        for after in following
    }
    staying = {(status.value, status.value) for status in ConfirmationStatus}
    assert allowed == declared | staying
    assert ("executed", "pending") not in allowed
    assert ("approved", "pending") not in allowed
    assert ("rejected", "approved") not in allowed


@postgresql_only
def test_the_installed_guards_are_what_the_declarations_render_today() -> None:
    """A declaration changed without a migration that installs the guards again fails here."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
        rendered = {
            name: statement.split("$$")[1]
            for statement in guards_sql(schema)
            for name in (
                CONFIRMATION_LIFECYCLE_FUNCTION,
                MOVEMENT_PROTOCOL_FUNCTION,
                PRUNE_FUNCTION,
            )
            if f"CREATE OR REPLACE FUNCTION {name}(" in statement
        }
        cursor.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", [list(rendered)]
        )
        installed = dict(cursor.fetchall())

    assert installed == rendered


@postgresql_only
@pytest.mark.parametrize("field", CONFIRMATION_FROZEN)
def test_a_frozen_column_of_a_confirmation_never_changes(make_agent: MakeAgent, field: str) -> None:
    agent, _ = make_agent()
    other, _ = make_agent()
    held = _confirmation(agent)
    changed: dict[str, Any] = {
        "id": "cf-other",
        "agent": other,
        "arguments": {"order_id": "ORD-1001", "amount_cents": 1, "currency": "BRL"},
        "amount_cents": 1,
        "policy_version": 2,
        "hold_reason": {"kind": "none"},
        "created_at": held.created_at - timedelta(days=1),
    }

    assert _refused(
        lambda: Confirmation.objects.filter(pk=held.pk).update(**{field: changed.get(field, "x")})
    )

    held.refresh_from_db()
    assert (held.amount_cents, held.customer_id, held.agent_id) == (6000, "CUS-1", agent.pk)


@postgresql_only
def test_the_columns_the_services_update_change_without_the_status(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    held = _confirmation(agent, ConfirmationStatus.EXECUTING)
    now = timezone.now()

    Confirmation.objects.filter(pk=held.pk).update(
        reviewers_required=2,
        decision_code="X",
        decision_reason="y",
        decided_at=now,
        executing_since=now,
        lease_expires_at=now,
        execution_sent_at=now,
        result={"ok": True},
        expires_at=held.expires_at - timedelta(hours=1),
    )

    assert _refused(
        lambda: Confirmation.objects.filter(pk=held.pk).update(
            expires_at=held.expires_at + timedelta(hours=1)
        )
    )
    held.refresh_from_db()
    assert (held.status, held.reviewers_required) == ("executing", 2)


# The reservations' protocol ---------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _movement(approval: str = "policy", **fields: Any) -> Movement:
    values: dict[str, Any] = {
        "key": f"mv-{next(_ids)}",
        "agent_id": 1,
        "session_id": "s-1",
        "customer_id": "CUS-1",
        "currency": "BRL",
        "tool": "refund_order",
        "subject": "ORD-1001",
        "amount_cents": 6000,
        "approval": approval,
        "at": NOW,
        "day": NOW.date(),
        "expires_at": NOW + timedelta(days=1) if approval == "held" else None,
        "confirmation_id": "cf-1" if approval != "policy" else "",
    }
    return Movement.objects.create(**{**values, **fields})


def _update(movement: Movement, **fields: Any) -> Callable[[], Any]:
    return lambda: Movement.objects.filter(pk=movement.pk).update(**fields)


LATER = NOW + timedelta(hours=1)

PROTOCOL: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    # what, approval, the row's own fields, the update, allowed
    ("a call's money released", "policy", {}, {"released_at": LATER}, True),
    ("held money released", "held", {}, {"released_at": LATER}, True),
    ("approved money released (failed)", "approved", {}, {"released_at": LATER}, True),
    ("held money approved", "held", {}, {"approval": "approved", "expires_at": None}, True),
    (
        "approved money executed",
        "approved",
        {},
        {"approval": "reviewer", "at": LATER, "day": LATER.date()},
        True,
    ),
    ("held money's expiry sooner", "held", {}, {"expires_at": NOW}, True),
    ("reserved again by the same call", "policy", {}, {"at": LATER, "day": LATER.date()}, True),
    (
        "a released reservation reserved anew",
        "policy",
        {"released_at": NOW},
        {"released_at": None, "approval": "held", "amount_cents": 1, "expires_at": LATER},
        True,
    ),
    ("money a reviewer moved released", "reviewer", {}, {"released_at": LATER}, False),
    ("money moved without a human made smaller", "policy", {}, {"amount_cents": 1}, False),
    ("held money made smaller", "held", {}, {"amount_cents": 1}, False),
    ("moved money turned into held", "policy", {}, {"approval": "held"}, False),
    (
        "held money turned into moved by a reviewer",
        "held",
        {},
        {"approval": "reviewer", "expires_at": None},
        False,
    ),
    (
        "approved money back to held",
        "approved",
        {},
        {"approval": "held", "expires_at": LATER},
        False,
    ),
    ("money moved to another customer", "policy", {}, {"customer_id": "CUS-2"}, False),
    ("money moved to another currency", "policy", {}, {"currency": "USD"}, False),
    (
        "money's time moved back out of the window",
        "policy",
        {},
        {"at": NOW - timedelta(days=2), "day": (NOW - timedelta(days=2)).date()},
        False,
    ),
    (
        "money's day moved off the agent's cap",
        "policy",
        {},
        {"day": NOW.date() - timedelta(days=1)},
        False,
    ),
    ("held money's expiry later", "held", {}, {"expires_at": LATER + timedelta(days=1)}, False),
    ("held money's expiry taken off", "held", {}, {"expires_at": None}, False),
    (
        "a released reservation's amount rewritten",
        "policy",
        {"released_at": NOW},
        {"amount_cents": 1},
        False,
    ),
    ("a reviewer's money rewritten", "reviewer", {}, {"at": LATER, "day": LATER.date()}, False),
]


@postgresql_only
@pytest.mark.parametrize(
    ("approval", "own", "update", "allowed"),
    [case[1:] for case in PROTOCOL],
    ids=[case[0] for case in PROTOCOL],
)
def test_a_reservation_moves_only_as_its_protocol_says(
    approval: str, own: dict[str, Any], update: dict[str, Any], allowed: bool
) -> None:
    movement = _movement(approval, **own)

    refused = _refused(_update(movement, **update))

    assert refused is not allowed
    if refused:
        kept = Movement.objects.get(pk=movement.pk)
        assert (kept.amount_cents, kept.approval, kept.at) == (6000, approval, NOW)


@postgresql_only
def test_a_reservation_is_never_deleted() -> None:
    movement = _movement("policy", released_at=NOW)

    assert _refused(lambda: Movement.objects.filter(pk=movement.pk).delete())

    assert Movement.objects.filter(pk=movement.pk).exists()


# The bounded prune --------------------------------------------------------------------------------


def _prune(keep_days: int, keep_rows: int, batches: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {PRUNE_FUNCTION}(%s, %s, %s)", [keep_days, keep_rows, batches])
        return int(cursor.fetchone()[0])


def _events(count: int, *, days_ago: float = 0) -> list[int]:
    at = timezone.now() - timedelta(days=days_ago)
    made = SecurityEvent.objects.bulk_create(
        SecurityEvent(at=at, method="POST", path="/", status=401, reason="x") for _ in range(count)
    )
    return [event.pk for event in made]


@postgresql_only
@pytest.mark.parametrize(
    ("keep_days", "keep_rows", "batches"),
    [
        (0, SECURITY_EVENTS_MIN_ROWS, 1),
        (-5, SECURITY_EVENTS_MIN_ROWS, 1),
        (30, SECURITY_EVENTS_MIN_ROWS - 1, 1),
        (30, 0, 1),
        (30, SECURITY_EVENTS_MIN_ROWS, 0),
        (30, SECURITY_EVENTS_MIN_ROWS, SECURITY_EVENTS_PRUNE_MAX_BATCHES + 1),
    ],
)
def test_the_prune_function_refuses_to_widen_what_is_due(
    keep_days: int, keep_rows: int, batches: int
) -> None:
    events = _events(5, days_ago=2)

    assert _refused(lambda: _prune(keep_days, keep_rows, batches), INVALID_PARAMETER_VALUE)

    assert SecurityEvent.objects.filter(pk__in=events).count() == 5


@postgresql_only
def test_the_prune_function_deletes_what_is_due_oldest_first_in_bounded_batches() -> None:
    old = _events(2 * SECURITY_EVENTS_PRUNE_BATCH + 10, days_ago=40)
    recent = _events(SECURITY_EVENTS_MIN_ROWS)

    first = _prune(30, SECURITY_EVENTS_MIN_ROWS, 1)
    rest = _prune(30, SECURITY_EVENTS_MIN_ROWS, SECURITY_EVENTS_PRUNE_MAX_BATCHES)

    assert (first, rest) == (SECURITY_EVENTS_PRUNE_BATCH, len(old) - SECURITY_EVENTS_PRUNE_BATCH)
    assert sorted(SecurityEvent.objects.values_list("pk", flat=True)) == recent

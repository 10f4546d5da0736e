"""The money guards: rendered from the domains' declarations (`money_guards` in their AppConfig),
installed by the latest migration that installs them, as they render today."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from django.db import connection

from dispatch.pipeline.tools import ChangedWithOperation, FixedOnceInLedger, SumOfLedger
from dispatch.store.guards import money_guards, money_guards_fingerprint, money_guards_sql

pytestmark = pytest.mark.django_db


def test_the_latest_migration_that_installs_the_money_guards_installs_them_as_declared_today() -> (
    None
):
    package = importlib.import_module("dispatch.migrations")
    recorded = [
        (name, module.MONEY_GUARDS_FINGERPRINT)
        for name in sorted(info.name for info in pkgutil.iter_modules(package.__path__))
        for module in [importlib.import_module(f"dispatch.migrations.{name}")]
        if hasattr(module, "MONEY_GUARDS_FINGERPRINT")
    ]

    assert recorded, "no migration installs the money guards"
    assert recorded[-1][1] == money_guards_fingerprint(), (
        f"the money guards render differently from what {recorded[-1][0]} installed: add a "
        "migration that calls money_guards_install and records the new money_guards_fingerprint()"
    )


def test_the_domains_declare_every_column_their_money_checks_read() -> None:
    declared = {(label, type(guard).__name__, guard.model) for label, guard in money_guards()}

    assert declared == {
        ("orders", "SumOfLedger", "Order"),
        ("orders", "FixedOnceInLedger", "Order"),
        ("retail", "ChangedWithOperation", "PaymentMethod"),
        ("retail", "ChangedWithOperation", "Payment"),
        ("retail", "ChangedWithOperation", "OrderItem"),
    }
    fixed = next(g for _, g in money_guards() if isinstance(g, FixedOnceInLedger))
    assert set(fixed.columns) == {"order_id", "customer_id", "total_cents", "currency"}
    summed = next(g for _, g in money_guards() if isinstance(g, SumOfLedger))
    assert (summed.column, summed.ledger) == ("refunded_cents", "Refund.order")
    balances = [g for _, g in money_guards() if isinstance(g, ChangedWithOperation)]
    assert ("balance_cents",) in [g.columns for g in balances]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the guards are PostgreSQL triggers")
def test_the_installed_money_guards_are_what_the_declarations_render_today() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
        rendered = {
            statement.split("FUNCTION ", 1)[1].split("(", 1)[0]: statement.split("$$")[1]
            for statement in money_guards_sql(schema)
            if statement.lstrip().startswith("CREATE OR REPLACE FUNCTION")
        }
        cursor.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", [list(rendered)]
        )
        installed = dict(cursor.fetchall())
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname = ANY(%s)",
            [
                [
                    statement.split("TRIGGER ", 1)[1].split()[0]
                    for statement in money_guards_sql(schema)
                    if statement.startswith("CREATE") and "TRIGGER" in statement.split("\n", 1)[0]
                ]
            ],
        )
        triggers = {name for (name,) in cursor.fetchall()}

    assert installed == rendered
    assert len(rendered) == 6
    assert {
        "orders_order_refunded_cents_matches_ledger",
        "orders_refund_refunded_cents_matches_ledger",
        "orders_order_fixed_once_in_ledger",
        "retail_operation_transaction_id",
        "retail_paymentmethod_changed_with_operation",
        "retail_payment_rows_with_operation",
        "retail_orderitem_changed_with_operation",
    } <= triggers

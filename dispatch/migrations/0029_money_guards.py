"""What the money checks read changes only as the domains declare (PostgreSQL).

An order's refunded_cents moves only with its ledger row (the constraint triggers of
orders 0005, rendered again from the declaration); its id, customer, total and currency change
only before its first refund; the retail desk's gift card balances, payments and items change only
in a transaction that records its operation. dispatch/store/guards.py renders them from each
app's `money_guards`.
"""

from django.db import migrations

from dispatch.store.guards import money_guards_install

# What the money guards it installs rendered when it was written (dispatch.store.guards).
MONEY_GUARDS_FINGERPRINT = "40b0fd6f5f55c3bc"


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    money_guards_install(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0028_security_event_books_channel"),
        ("orders", "0006_more_currencies"),
        ("retail", "0002_operation_transaction"),
    ]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

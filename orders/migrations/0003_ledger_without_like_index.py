from django.db import migrations


def _drop_like_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Django adds a varchar_pattern_ops copy of a unique CharField on PostgreSQL, for LIKE
    # queries. Nothing searches the ledger's idempotency keys by prefix, and every refund
    # inserts one.
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes "
            "WHERE tablename = 'orders_refund' AND indexname LIKE '%%_like'"
        )
        for (name,) in cursor.fetchall():
            schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"', params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("orders", "0002_ledger_append_only"),
    ]

    operations = [migrations.RunPython(_drop_like_index, migrations.RunPython.noop)]

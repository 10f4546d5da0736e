"""On PostgreSQL the refund ledger refuses UPDATE and DELETE: a refund that took effect stays.

Row triggers do not fire on TRUNCATE, which only an operator (or a test run's flush) can issue.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION orders_ledger_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the refund ledger is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER orders_refund_append_only
    BEFORE UPDATE OR DELETE ON orders_refund
    FOR EACH ROW EXECUTE FUNCTION orders_ledger_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS orders_refund_append_only ON orders_refund;
DROP FUNCTION IF EXISTS orders_ledger_append_only();
"""


def _run(sql: str):  # type: ignore[no-untyped-def]
    def apply(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            # No parameters: psycopg would read the `%` of RAISE EXCEPTION as a placeholder.
            schema_editor.execute(sql, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [("orders", "0001_initial")]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP))]

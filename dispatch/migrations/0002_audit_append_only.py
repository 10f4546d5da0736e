"""On PostgreSQL the audit record refuses UPDATE and DELETE, whoever asks.

Row triggers do not fire on TRUNCATE, which only an operator (or a test run's flush) can issue.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION dispatch_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit record is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER dispatch_auditrecord_append_only
    BEFORE UPDATE OR DELETE ON dispatch_auditrecord
    FOR EACH ROW EXECUTE FUNCTION dispatch_audit_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS dispatch_auditrecord_append_only ON dispatch_auditrecord;
DROP FUNCTION IF EXISTS dispatch_audit_append_only();
"""


def _run(sql: str):  # type: ignore[no-untyped-def]
    def apply(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            # No parameters: psycopg would read the `%` of RAISE EXCEPTION as a placeholder.
            schema_editor.execute(sql, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0001_initial")]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP))]

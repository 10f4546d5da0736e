"""Security events: the agent API's refused requests. On PostgreSQL a row is never updated
(deleting old rows is how the table stays bounded, so DELETE stays allowed)."""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION dispatch_security_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'security events are append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER dispatch_securityevent_append_only
    BEFORE UPDATE ON dispatch_securityevent
    FOR EACH ROW EXECUTE FUNCTION dispatch_security_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS dispatch_securityevent_append_only ON dispatch_securityevent;
DROP FUNCTION IF EXISTS dispatch_security_event_append_only();
"""


def _run(sql: str):  # type: ignore[no-untyped-def]
    def apply(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            # No parameters: psycopg would read the `%` of RAISE EXCEPTION as a placeholder.
            schema_editor.execute(sql, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0005_allowance_window_cap_and_movements"),
    ]

    operations = [
        migrations.CreateModel(
            name="SecurityEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField(db_index=True)),
                ("client_address", models.GenericIPAddressField(blank=True, null=True)),
                ("method", models.CharField(max_length=16)),
                ("path", models.CharField(max_length=200)),
                ("status", models.PositiveSmallIntegerField()),
                (
                    "reason",
                    models.CharField(
                        help_text="the error's code, as the client got it", max_length=64
                    ),
                ),
                ("detail", models.CharField(blank=True, max_length=200)),
                (
                    "agent",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="dispatch.agent",
                    ),
                ),
            ],
        ),
        migrations.RunPython(_run(CREATE), _run(DROP)),
    ]

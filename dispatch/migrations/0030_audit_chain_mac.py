"""Each audit record carries its hash's MAC under the audit key (docs/audit.md).

Records written before are given theirs here, under the key this migration runs with: run
`verify_audit` before upgrading, so that the key vouches only for chains that held. On
PostgreSQL the append-only trigger is set aside for it: this migration runs as the tables' owner.
"""

from django.db import migrations, models

from dispatch.audit_keys import audit_sign_existing


def sign_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    rows = apps.get_model("dispatch", "AuditRecord").objects.all()
    audit_sign_existing(schema_editor, rows, "dispatch_auditrecord")


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0029_money_guards"),
    ]

    operations = [
        # A column added in place, on SQLite too: remaking the table there would try to build
        # the PostgreSQL-only search index the model declares.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE dispatch_auditrecord "
                    "ADD COLUMN chain_mac varchar(100) NOT NULL DEFAULT ''",
                    "ALTER TABLE dispatch_auditrecord DROP COLUMN chain_mac",
                )
            ],
            state_operations=[
                migrations.AddField(
                    model_name="auditrecord",
                    name="chain_mac",
                    field=models.CharField(blank=True, default="", max_length=100),
                )
            ],
        ),
        migrations.RunPython(sign_existing, migrations.RunPython.noop),
    ]

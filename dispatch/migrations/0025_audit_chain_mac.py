"""Each audit record carries its hash's MAC under the audit key (docs/audit.md).

Records written before are given theirs here, under the key this migration runs with: run
`verify_audit` before upgrading, so that the key vouches only for chains that held. On
PostgreSQL the append-only trigger is set aside for it: this migration runs as the tables' owner.
"""

from django.db import migrations, models

from dispatch.audit_keys import audit_mac

BATCH = 2000


def sign_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    table = "dispatch_auditrecord"
    rows = (
        apps.get_model("dispatch", "AuditRecord")
        .objects.filter(chain_mac="")
        .exclude(chain_hash="")
    )
    if not rows.exists():
        return
    postgresql = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        last = 0
        while True:
            batch = list(
                rows.filter(id__gt=last).order_by("id").values_list("id", "chain_hash")[:BATCH]
            )
            if not batch:
                break
            cursor.executemany(
                f"UPDATE {table} SET chain_mac = %s WHERE id = %s",
                [(audit_mac(chain_hash), pk) for pk, chain_hash in batch],
            )
            last = batch[-1][0]
        if postgresql:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0024_money_guards"),
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

"""Each confirmation event carries its hash's MAC under the audit key (docs/audit.md); events
written before are given theirs here, as dispatch 0025 does for the audit records."""

from django.db import migrations, models

from dispatch.audit_keys import audit_mac

BATCH = 2000


def sign_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    table = "approvals_confirmationevent"
    rows = (
        apps.get_model("approvals", "ConfirmationEvent")
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
        ("approvals", "0007_event_chains"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmationevent",
            name="chain_mac",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(sign_existing, migrations.RunPython.noop),
    ]

"""Each confirmation's events chained, with the head on the confirmation
(dispatch/pipeline/audit_chain.py defines the hash)."""

from django.db import migrations, models

from dispatch.pipeline.audit_chain import (
    EVENT_FIELDS,
    GENESIS,
    covered,
    event_chain,
    link_hash,
)

# Rows written before the chains existed are chained here, in id order, so that every chain
# starts at its first row. On PostgreSQL the append-only triggers are set aside for it: this
# migration runs as the tables' owner.
BATCH = 2000


def _chain_existing(  # type: ignore[no-untyped-def]
    schema_editor, rows, *, table, fields, chain_of, head_of, heads_sql
):
    connection = schema_editor.connection
    if not rows.exists():
        return
    postgresql = connection.vendor == "postgresql"
    heads: dict[tuple[object, ...], tuple[int, str]] = {}
    with connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        last = 0
        while True:
            batch = list(rows.filter(id__gt=last).order_by("id").values("id", *fields)[:BATCH])
            if not batch:
                break
            updates = []
            for row in batch:
                owner = head_of(row)
                seq, previous = heads.get(owner, (0, GENESIS))
                seq += 1
                previous = link_hash(
                    chain=chain_of(row), seq=seq, previous=previous, fields=covered(fields, row)
                )
                heads[owner] = (seq, previous)
                updates.append((seq, previous, row["id"]))
            cursor.executemany(
                f"UPDATE {table} SET chain_seq = %s, chain_hash = %s WHERE id = %s", updates
            )
            last = batch[-1]["id"]
        if postgresql:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        owners = list(heads.items())
        for start in range(0, len(owners), BATCH):
            cursor.executemany(
                heads_sql,
                [(seq, head, *owner) for owner, (seq, head) in owners[start : start + BATCH]],
            )


def chain_events(apps, schema_editor):  # type: ignore[no-untyped-def]
    _chain_existing(  # type: ignore[no-untyped-call]
        schema_editor,
        apps.get_model("approvals", "ConfirmationEvent").objects.all(),
        table="approvals_confirmationevent",
        fields=EVENT_FIELDS,
        chain_of=lambda row: event_chain(row["confirmation_id"]),
        head_of=lambda row: (row["confirmation_id"],),
        heads_sql="UPDATE dispatch_confirmation SET event_seq = %s, event_head = %s WHERE id = %s",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_webhook_next_attempt"),
        ("dispatch", "0020_audit_chains"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmationevent",
            name="chain_hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="confirmationevent",
            name="chain_seq",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(chain_events, migrations.RunPython.noop),
    ]

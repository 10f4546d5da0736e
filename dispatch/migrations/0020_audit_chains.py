"""Audit records chained per session, with the head on the session; confirmation heads; seals.

dispatch/pipeline/audit_chain.py defines the hash. The confirmation events' own columns are
approvals' (its migration chains them).
"""

from django.db import migrations, models

from dispatch.pipeline.audit_chain import (
    AUDIT_FIELDS,
    GENESIS,
    audit_chain,
    covered,
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


def chain_audit_records(apps, schema_editor):  # type: ignore[no-untyped-def]
    _chain_existing(  # type: ignore[no-untyped-call]
        schema_editor,
        apps.get_model("dispatch", "AuditRecord").objects.all(),
        table="dispatch_auditrecord",
        fields=AUDIT_FIELDS,
        chain_of=lambda row: audit_chain(row["agent_id"], row["session_id"]),
        head_of=lambda row: (row["agent_id"], row["session_id"]),
        heads_sql="UPDATE dispatch_session SET audit_seq = %s, audit_head = %s "
        "WHERE agent_id = %s AND session_id = %s",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0019_least_privilege"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditSeal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveBigIntegerField(unique=True)),
                ("at", models.DateTimeField()),
                ("previous", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
                ("heads", models.JSONField(default=list)),
            ],
            options={
                "ordering": ["number"],
            },
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="chain_hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="chain_seq",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="confirmation",
            name="event_head",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="confirmation",
            name="event_seq",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="session",
            name="audit_head",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="session",
            name="audit_seq",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.RunPython(chain_audit_records, migrations.RunPython.noop),
    ]

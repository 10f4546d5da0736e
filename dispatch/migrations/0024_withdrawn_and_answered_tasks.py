"""A held call the agent's host withdraws (a new final status of the confirmation lifecycle, so
its guard is installed again from the declaration), and the MCP tasks answered at once, kept for
their ttl."""

import django.db.models.deletion
from django.db import migrations, models

from dispatch.store.guards import guards_install

# What the guards it installs rendered when it was written (dispatch.store.guards).
GUARDS_FINGERPRINT = "44beb37a74897a9e"


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    guards_install(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0023_idempotency_records_by_session"),
    ]

    operations = [
        migrations.AlterField(
            model_name="confirmation",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("approved", "Approved"),
                    ("executing", "Executing"),
                    ("executed", "Executed"),
                    ("failed", "Failed"),
                    ("unknown", "Unknown"),
                    ("rejected", "Rejected"),
                    ("expired", "Expired"),
                    ("invalidated", "Invalidated"),
                    ("withdrawn", "Withdrawn"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="AnsweredTask",
            fields=[
                ("id", models.CharField(max_length=48, primary_key=True, serialize=False)),
                ("customer_id", models.CharField(max_length=64)),
                ("tool", models.CharField(max_length=64)),
                ("result", models.JSONField()),
                ("ok", models.BooleanField()),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField(db_index=True)),
                (
                    "agent",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="dispatch.agent",
                    ),
                ),
            ],
        ),
        # Backwards, the newer guard stays: it allows every move the older one did.
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

# The Confirmation model, with its rows, from approvals (approvals.0002 renamed its table).

import django.db.models.deletion
from django.db import migrations, models


def _move_content_type(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Permissions granted on confirmations (the reviewers' group) follow the model.
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label="dispatch", model="confirmation").exists():
        content_type.objects.filter(app_label="approvals", model="confirmation").update(
            app_label="dispatch"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0002_confirmation_moves_to_dispatch"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("dispatch", "0003_fewer_indexes_on_hot_tables"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="Confirmation",
                    fields=[
                        ("id", models.CharField(max_length=32, primary_key=True, serialize=False)),
                        ("key", models.CharField(db_index=True, max_length=64)),
                        ("tool", models.CharField(max_length=64)),
                        ("arguments", models.JSONField()),
                        ("arguments_hash", models.CharField(max_length=64)),
                        ("session_id", models.CharField(max_length=128)),
                        ("customer_id", models.CharField(max_length=64)),
                        ("policy_version", models.PositiveIntegerField()),
                        ("reviewers_required", models.PositiveSmallIntegerField(default=1)),
                        ("amount_cents", models.PositiveBigIntegerField(blank=True, null=True)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("approved", "Approved"),
                                    ("rejected", "Rejected"),
                                    ("expired", "Expired"),
                                    ("executed", "Executed"),
                                    ("failed", "Failed"),
                                ],
                                default="pending",
                                max_length=16,
                            ),
                        ),
                        ("result", models.JSONField(blank=True, null=True)),
                        ("created_at", models.DateTimeField()),
                        ("expires_at", models.DateTimeField()),
                        ("decided_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "agent",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="confirmations",
                                to="dispatch.agent",
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["created_at"],
                        "indexes": [
                            models.Index(
                                fields=["status", "expires_at"], name="confirmation_queue_idx"
                            )
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(_move_content_type, migrations.RunPython.noop),
    ]

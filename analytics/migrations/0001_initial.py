"""The rollups move from dispatch with their tables: the models change apps in Django's state
only (SeparateDatabaseAndState), and no table, row, constraint or index is touched. Their content
types move along, so that permissions given on them stay given."""

import django.db.models.deletion
from django.db import migrations, models

MOVED = ("callrollup", "callrollupday", "decisionrollup", "pendingrecovery")


def _content_types_to(app_label: str, other: str):  # type: ignore[no-untyped-def]
    def move(apps, schema_editor):  # type: ignore[no-untyped-def]
        ContentType = apps.get_model("contenttypes", "ContentType")
        there = set(
            ContentType.objects.filter(app_label=app_label, model__in=MOVED).values_list(
                "model", flat=True
            )
        )
        ContentType.objects.filter(app_label=other, model__in=set(MOVED) - there).update(
            app_label=app_label
        )

    return move


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("dispatch", "0015_held_money"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="CallRollup",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("tool", models.CharField(max_length=128)),
                        ("code", models.CharField(max_length=64)),
                        ("calls", models.PositiveIntegerField(default=0)),
                        ("replayed", models.PositiveIntegerField(default=0)),
                        ("correctable", models.PositiveIntegerField(default=0)),
                        ("recovered", models.PositiveIntegerField(default=0)),
                        ("hour", models.DateTimeField()),
                        (
                            "agent",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="dispatch.agent",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dispatch_callrollup",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("hour", "agent", "tool", "code"),
                                name="rollup_per_hour_agent_tool_code",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="CallRollupDay",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("tool", models.CharField(max_length=128)),
                        ("code", models.CharField(max_length=64)),
                        ("calls", models.PositiveIntegerField(default=0)),
                        ("replayed", models.PositiveIntegerField(default=0)),
                        ("correctable", models.PositiveIntegerField(default=0)),
                        ("recovered", models.PositiveIntegerField(default=0)),
                        ("day", models.DateField()),
                        (
                            "agent",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="dispatch.agent",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dispatch_callrollupday",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("day", "agent", "tool", "code"),
                                name="rollup_per_day_agent_tool_code",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="DecisionRollup",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("day", models.DateField()),
                        ("tool", models.CharField(max_length=64)),
                        ("decided_by", models.CharField(max_length=150)),
                        ("bucket", models.PositiveSmallIntegerField()),
                        ("decisions", models.PositiveIntegerField(default=0)),
                        (
                            "agent",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="dispatch.agent",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dispatch_decisionrollup",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("day", "agent", "tool", "decided_by", "bucket"),
                                name="decisions_per_day_agent_tool_decider_bucket",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="PendingRecovery",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("session_id", models.CharField(max_length=128)),
                        ("step", models.PositiveIntegerField()),
                        ("tool", models.CharField(max_length=128)),
                        ("code", models.CharField(max_length=64)),
                        ("hour", models.DateTimeField()),
                        (
                            "agent",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="dispatch.agent",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dispatch_pendingrecovery",
                        "indexes": [
                            models.Index(
                                fields=["agent", "session_id"], name="pending_recovery_session"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(
            _content_types_to("analytics", "dispatch"), _content_types_to("dispatch", "analytics")
        ),
    ]

"""The fill state: from this release the rollups are filled by beat from the audit records and the
confirmations' event log, no longer by each call's and each decision's own statement.

Where calls or decisions are already recorded, the rollups were counted by the release before,
whose processes may still count a few more until they are restarted: the state is marked
STARTED, and the first fill refills the rollups whole from the records (analytics/fills.py)."""

from django.db import migrations, models
from django.utils import timezone

STARTED = 2


def _mark_half_filled(apps, schema_editor):  # type: ignore[no-untyped-def]
    FillState = apps.get_model("analytics", "FillState")
    now = timezone.now()
    recorded = {
        "calls": apps.get_model("dispatch", "AuditRecord").objects.exists(),
        "decisions": apps.get_model("approvals", "ConfirmationEvent").objects.exists(),
    }
    FillState.objects.bulk_create(
        FillState(property=name, end_time=now, state=STARTED, last_modified=now)
        for name, found in recorded.items()
        if found
    )


class Migration(migrations.Migration):
    dependencies = [
        ("analytics", "0001_initial"),
        ("dispatch", "0016_rollups_move_to_analytics"),
        ("approvals", "0006_webhook_next_attempt"),
    ]

    operations = [
        migrations.CreateModel(
            name="FillState",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("property", models.CharField(max_length=40, unique=True)),
                ("last_id", models.BigIntegerField(default=0)),
                ("end_time", models.DateTimeField()),
                (
                    "state",
                    models.PositiveSmallIntegerField(choices=[(1, "Done"), (2, "Started")]),
                ),
                ("last_modified", models.DateTimeField()),
            ],
        ),
        migrations.RunPython(_mark_half_filled, migrations.RunPython.noop),
    ]

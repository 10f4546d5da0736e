"""Events of a reviewer's edit: edited (on the edited call) and superseded (on the original)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0009_notifications"),
    ]

    operations = [
        migrations.AlterField(
            model_name="confirmationevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("voted", "Voted"),
                    ("separate", "Separate"),
                    ("approved", "Approved"),
                    ("rejected", "Rejected"),
                    ("expired", "Expired"),
                    ("invalidated", "Invalidated"),
                    ("executing", "Executing"),
                    ("executed", "Executed"),
                    ("failed", "Failed"),
                    ("unknown", "Unknown"),
                    ("reconciled", "Reconciled"),
                    ("withdrawn", "Withdrawn"),
                    ("escalated", "Escalated"),
                    ("reminded", "Reminded"),
                    ("edited", "Edited"),
                    ("superseded", "Superseded"),
                ],
                max_length=16,
            ),
        ),
    ]

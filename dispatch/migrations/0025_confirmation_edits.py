"""A reviewer's edit of a held call: the edited call names the one it was edited from, which is
superseded. The lifecycle's trigger is installed again (dispatch/store/guards.py): pending may
now move to superseded, and edited_from never changes."""

from django.db import migrations, models

from dispatch.store.guards import guards_drop, guards_install

# What the guards it installs rendered when it was written (dispatch.store.guards).
GUARDS_FINGERPRINT = "620199ebd1a272a8"


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    guards_install(schema_editor)


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    guards_drop(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0024_withdrawn_and_answered_tasks"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmation",
            name="edited_from",
            field=models.CharField(blank=True, db_index=True, default="", max_length=32),
        ),
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
                    ("superseded", "Superseded"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.RunPython(install, drop),
    ]

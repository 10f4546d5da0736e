"""The rollups now live in analytics (its 0001_initial): dispatch lets go of them in Django's
state only, and their tables stay as they are."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0015_held_money"),
        ("analytics", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="CallRollup"),
                migrations.DeleteModel(name="CallRollupDay"),
                migrations.DeleteModel(name="DecisionRollup"),
                migrations.DeleteModel(name="PendingRecovery"),
            ],
            database_operations=[],
        ),
    ]

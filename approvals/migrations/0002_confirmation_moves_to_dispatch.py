# The held call is the pipeline's state, so its model moves to dispatch with its rows: the table
# is renamed here, and dispatch.0004 takes the model over without touching the database.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterModelTable(name="confirmation", table="dispatch_confirmation"),
            ],
            state_operations=[
                migrations.DeleteModel(name="Confirmation"),
            ],
        ),
    ]

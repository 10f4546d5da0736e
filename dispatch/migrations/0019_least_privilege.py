"""The application's role changes rows only as the product does (PostgreSQL).

A confirmation's status moves only along its lifecycle and what it is never changes; a
reservation of money moves only as its protocol says and is never deleted; security events are
deleted only through `toolgate_prune_security_events`, bounded. dispatch/store/guards.py renders
them from the declarations they enforce. A policy version keeps the user who made it: a user who
made one is disabled, not deleted (the application's role may not update a version).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from dispatch.store.guards import guards_drop, guards_install

# What the guards it installs rendered when it was written (dispatch.store.guards).
GUARDS_FINGERPRINT = "f69c3b7fcfb9f6b5"


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    guards_install(schema_editor)


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    guards_drop(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0018_key_status_from_the_core"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="policy",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(install, drop),
    ]

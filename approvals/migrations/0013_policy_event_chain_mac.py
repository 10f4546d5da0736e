"""Each policy event carries its hash's MAC under the audit key (docs/audit.md), as a
confirmation event does; events written before are given theirs here."""

from django.db import migrations, models

from dispatch.audit_keys import audit_sign_existing


def sign_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    rows = apps.get_model("approvals", "PolicyEvent").objects.all()
    audit_sign_existing(schema_editor, rows, "approvals_policyevent")


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0012_event_chain_mac"),
    ]

    operations = [
        migrations.AddField(
            model_name="policyevent",
            name="chain_mac",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(sign_existing, migrations.RunPython.noop),
    ]

"""Each confirmation event carries its hash's MAC under the audit key (docs/audit.md); events
written before are given theirs here, as dispatch 0025 does for the audit records."""

from django.db import migrations, models

from dispatch.audit_keys import audit_sign_existing


def sign_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    rows = apps.get_model("approvals", "ConfirmationEvent").objects.all()
    audit_sign_existing(schema_editor, rows, "approvals_confirmationevent")


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0011_policy_changes"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmationevent",
            name="chain_mac",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(sign_existing, migrations.RunPython.noop),
    ]

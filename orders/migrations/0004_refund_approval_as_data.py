# Who approved a refund becomes data: `approval` (the policy, or reviewers named in approved_by).

from django.db import migrations, models


def _approval_from_text(apps, schema_editor):  # type: ignore[no-untyped-def]
    refund = apps.get_model("orders", "Refund")
    postgresql = schema_editor.connection.vendor == "postgresql"
    if postgresql:
        # The ledger refuses UPDATE (0002); this one change of its shape is the owner's.
        schema_editor.execute("ALTER TABLE orders_refund DISABLE TRIGGER orders_refund_append_only")
    refund.objects.filter(approved_by="policy").update(approval="policy", approved_by="")
    if postgresql:
        schema_editor.execute("ALTER TABLE orders_refund ENABLE TRIGGER orders_refund_append_only")


class Migration(migrations.Migration):
    dependencies = [
        ("orders", "0003_ledger_without_like_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="refund",
            name="approval",
            field=models.CharField(
                choices=[("policy", "Policy"), ("reviewer", "Reviewer")],
                default="reviewer",
                max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="refund",
            name="approved_by",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.RunPython(_approval_from_text, migrations.RunPython.noop),
    ]

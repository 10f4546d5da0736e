"""Held money in the customer's sum: a held call's money is reserved under its confirmation's
execution key. Confirmations already open get their reservation here, as a hold makes it now:
pending ones count until their expiry, approved, executing and unknown ones until their execution
ends. Executed ones already have their movement (moved with a reviewer) under the same key."""

from django.db import migrations, models

from dispatch.pipeline.allowance import execution_key

_ON_ITS_WAY = {
    "pending": "held",
    "approved": "approved",
    "executing": "approved",
    "unknown": "approved",
}


def _reserve_open_confirmations(apps, schema_editor):  # type: ignore[no-untyped-def]
    # The registry says which arguments are a tool's money; imported here, where the apps are
    # ready.
    from dispatch.registry import tool_registry

    Confirmation = apps.get_model("dispatch", "Confirmation")
    Movement = apps.get_model("dispatch", "Movement")
    open_ones = Confirmation.objects.filter(
        status__in=_ON_ITS_WAY, amount_cents__isnull=False
    ).order_by("created_at")
    for confirmation in open_ones.iterator(chunk_size=500):
        spec = tool_registry.get(confirmation.tool)
        arguments = confirmation.arguments if isinstance(confirmation.arguments, dict) else {}
        currency_field = spec.currency_field if spec is not None else "currency"
        subject_field = spec.subject_field if spec is not None else None
        approval = _ON_ITS_WAY[confirmation.status]
        Movement.objects.get_or_create(
            key=execution_key(confirmation.pk),
            defaults={
                "agent_id": confirmation.agent_id,
                "session_id": confirmation.session_id,
                "customer_id": confirmation.customer_id,
                "currency": str(arguments.get(currency_field or "", "")),
                "tool": confirmation.tool,
                "subject": str(arguments.get(subject_field or "", "")),
                "amount_cents": confirmation.amount_cents,
                "approval": approval,
                "at": confirmation.created_at,
                "day": confirmation.created_at.date(),
                "expires_at": confirmation.expires_at if approval == "held" else None,
                "confirmation_id": confirmation.pk,
            },
        )


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0014_security_event_channel_host_key_session"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmation",
            name="duplicate_of",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="confirmation",
            name="execution_sent_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="confirmation",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="movement",
            name="confirmation_id",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.AddField(
            model_name="movement",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="movement",
            name="approval",
            field=models.CharField(
                choices=[
                    ("policy", "Policy"),
                    ("reviewer", "Reviewer"),
                    ("held", "Held"),
                    ("approved", "Approved"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddIndex(
            model_name="movement",
            index=models.Index(
                condition=models.Q(
                    ("approval__in", ["held", "approved"]), ("released_at__isnull", True)
                ),
                fields=["customer_id", "currency"],
                name="movement_on_its_way_idx",
            ),
        ),
        migrations.RunPython(_reserve_open_confirmations, migrations.RunPython.noop),
    ]

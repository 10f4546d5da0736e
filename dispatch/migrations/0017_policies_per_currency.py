"""Policies per currency. Each agent whose current policy keeps one set of thresholds for every
currency gets a new version (the old one is never rewritten) with the same numbers for each
currency the orders hold, or BRL, USD and EUR where there are none yet: no decision changes.
Held calls keep the currency of their amount."""

import django.core.validators
from django.db import migrations, models

# Where no order says which currencies are in use: the ones the thresholds were meant for.
_KNOWN_CURRENCIES = ("BRL", "USD", "EUR")


def _versions_per_currency(apps, schema_editor):  # type: ignore[no-untyped-def]
    Agent = apps.get_model("dispatch", "Agent")
    Policy = apps.get_model("dispatch", "Policy")
    Order = apps.get_model("orders", "Order")
    currencies = sorted(set(Order.objects.values_list("currency", flat=True).distinct()))
    currencies = currencies or list(_KNOWN_CURRENCIES)
    for agent in Agent.objects.exclude(current_policy=None).select_related("current_policy"):
        current = agent.current_policy
        if current.currency_limits is not None:
            continue
        limits = {
            "max_amount_cents": current.max_amount_cents,
            "auto_approve_below_cents": current.auto_approve_below_cents or 0,
            "two_reviewers_from_cents": current.two_reviewers_from_cents,
            "daily_cap_cents": current.daily_cap_cents,
        }
        latest = max(Policy.objects.filter(agent=agent).values_list("version", flat=True))
        version = Policy.objects.create(
            agent=agent,
            version=latest + 1,
            allowed_tools=current.allowed_tools,
            currency_limits={currency: dict(limits) for currency in currencies},
            human_rules={},
            auto_approve_window_seconds=current.auto_approve_window_seconds,
            step_budget=current.step_budget,
            repeat_limit=current.repeat_limit,
            confirmation_ttl_seconds=current.confirmation_ttl_seconds,
            created_by=current.created_by,
        )
        agent.current_policy = version
        agent.save(update_fields=["current_policy"])


def _held_calls_keep_their_currency(apps, schema_editor):  # type: ignore[no-untyped-def]
    from dispatch.registry import tool_registry

    Confirmation = apps.get_model("dispatch", "Confirmation")
    held = Confirmation.objects.filter(currency="", amount_cents__isnull=False)
    for confirmation in held.iterator(chunk_size=500):
        spec = tool_registry.get(confirmation.tool)
        field = spec.currency_field if spec is not None else "currency"
        arguments = confirmation.arguments if isinstance(confirmation.arguments, dict) else {}
        currency = str(arguments.get(field or "", ""))
        if currency:
            Confirmation.objects.filter(pk=confirmation.pk).update(currency=currency)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0016_rollups_move_to_analytics"),
        ("orders", "0006_more_currencies"),
    ]

    operations = [
        migrations.AddField(
            model_name="confirmation",
            name="currency",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.AddField(
            model_name="policy",
            name="currency_limits",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="policy",
            name="human_rules",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AlterField(
            model_name="policy",
            name="auto_approve_below_cents",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="policy",
            name="auto_approve_window_seconds",
            field=models.PositiveIntegerField(
                default=86400,
                help_text="the customer's sum counts what moved within this many seconds",
                validators=[django.core.validators.MinValueValidator(60)],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="daily_cap_cents",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="policy",
            name="max_amount_cents",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(_versions_per_currency, migrations.RunPython.noop),
        migrations.RunPython(_held_calls_keep_their_currency, migrations.RunPython.noop),
    ]

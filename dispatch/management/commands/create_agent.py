"""Create an agent with its first policy and print its token, once."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction

from dispatch.management.policies import (
    DEFAULT_LIMITS,
    DEFAULT_POLICY,
    LIMIT_FLAGS,
    count,
    currency_limits,
    describe_policy,
    human_rule,
    per_currency,
    ttl_seconds,
)
from dispatch.models import Agent
from dispatch.registry import tool_registry
from dispatch.services import UnknownTools, agent_create
from dispatch.webhooks import WebhookUrlInvalid, agent_webhook_set, webhook_target


class Command(BaseCommand):
    help = (
        "Create an agent host with its first policy version. The token is printed once and "
        "stored only as a hash."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="a unique name for the agent, such as support-bot")
        parser.add_argument(
            "--tools",
            nargs="+",
            required=True,
            metavar="TOOL",
            help="the tools the agent may call, such as: get_order refund_order",
        )
        money = (
            " in major units per currency, such as BRL:50 USD:10 JPY:1500 KWD:12.500; a currency "
            "named by no such option keeps the defaults, and a currency named by none at all is "
            "held for a human"
        )
        parser.add_argument(
            "--max-amount",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help=f"the largest amount one call may move{money} (default "
            f"{DEFAULT_LIMITS['max_amount']})",
        )
        parser.add_argument(
            "--auto-approve-below",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help="no human is asked while the customer's sum in the currency within the window "
            "(everything moved or on its way, the call included) stays below this; 0 holds "
            f"every call{money} (default {DEFAULT_LIMITS['auto_approve_below']})",
        )
        parser.add_argument(
            "--two-reviewers-from",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help=f"from this sum two reviewers must approve, CUR:none for never{money} "
            f"(default {DEFAULT_LIMITS['two_reviewers_from']})",
        )
        parser.add_argument(
            "--daily-cap",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help=f"what the agent may move without a human per UTC day, CUR:none for no cap"
            f"{money} (default none)",
        )
        parser.add_argument(
            "--confirm-above",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help="above this amount a reviewer's approval asks once more, showing the amount and "
            f"the customer's sum; CUR:none for never{money} (default none)",
        )
        parser.add_argument(
            "--factor-above",
            nargs="+",
            type=per_currency,
            default=(),
            metavar="CUR:AMOUNT",
            help="above this amount an approval needs the reviewer's fresh second factor (TOTP); "
            f"CUR:none for never{money} (default none)",
        )
        parser.add_argument(
            "--human",
            nargs="+",
            type=human_rule,
            default=(),
            metavar="TOOL:RULE",
            help="whether a human decides a tool's calls: never, always or by_amount, such as "
            "refund_order:always (default: by amount for a high-risk tool, else never)",
        )
        parser.add_argument(
            "--auto-approve-window-seconds",
            type=ttl_seconds,
            default=DEFAULT_POLICY["auto_approve_window_seconds"],
            help="the rolling window of the customer's sum, at least 60 (default %(default)s)",
        )
        parser.add_argument(
            "--step-budget",
            type=count,
            default=DEFAULT_POLICY["step_budget"],
            help="calls per session (default %(default)s)",
        )
        parser.add_argument(
            "--repeat-limit",
            type=count,
            default=DEFAULT_POLICY["repeat_limit"],
            help="identical calls per session before LOOP_DETECTED (default %(default)s)",
        )
        parser.add_argument(
            "--confirmation-ttl-seconds",
            type=ttl_seconds,
            default=DEFAULT_POLICY["confirmation_ttl_seconds"],
            help="how long a held call may be approved, at least 60 (default %(default)s)",
        )
        parser.add_argument(
            "--webhook-url",
            default="",
            metavar="URL",
            help="where decisions and results of its confirmations are POSTed, signed with a "
            "secret printed once (https, a public address; see docs/webhooks.md)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        longest = Agent._meta.get_field("name").max_length or 100
        if not name or len(name) > longest:
            raise CommandError(f"The name must be 1 to {longest} characters.")
        if Agent.objects.filter(name=name).exists():
            raise CommandError(f"An agent named {name!r} already exists; choose another name.")
        webhook_url = options["webhook_url"].strip()
        if webhook_url:
            try:
                webhook_target(webhook_url)
            except WebhookUrlInvalid as exc:
                raise CommandError(f"--webhook-url: {exc}") from None
        try:
            currencies = currency_limits(
                {flag: options[flag] for flag in LIMIT_FLAGS}, settings.TOOLGATE_POLICY_CURRENCIES
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        secret = None
        try:
            with transaction.atomic():
                agent, token = agent_create(
                    name=name,
                    allowed_tools=options["tools"],
                    currencies=currencies,
                    humans=dict(options["human"]),
                    auto_approve_window_seconds=options["auto_approve_window_seconds"],
                    step_budget=options["step_budget"],
                    repeat_limit=options["repeat_limit"],
                    confirmation_ttl_seconds=options["confirmation_ttl_seconds"],
                )
                if webhook_url:
                    secret = agent_webhook_set(agent=agent, url=webhook_url)
        except WebhookUrlInvalid as exc:
            # The host resolved elsewhere since it was checked above.
            raise CommandError(f"--webhook-url: {exc}") from None
        except UnknownTools as exc:
            known = ", ".join(sorted(spec.name for spec in tool_registry))
            raise CommandError(
                f"Unknown tools: {', '.join(exc.names)}. The tools are: {known}."
            ) from None
        except IntegrityError:
            # Created meanwhile by someone else.
            raise CommandError(
                f"An agent named {name!r} already exists; choose another name."
            ) from None

        assert agent.current_policy is not None
        self.stdout.write(self.style.SUCCESS(f"Created agent {agent.name!r} (id {agent.pk})."))
        self.stdout.write("")
        self.stdout.write(f"Token: {token}")
        self.stdout.write(
            self.style.WARNING(
                "This token is shown once and will not be shown again: store it now. "
                "Toolgate keeps only its hash."
            )
        )
        if secret is not None:
            self.stdout.write("")
            self.stdout.write(f"Webhook: {agent.webhook_url}")
            self.stdout.write(f"Webhook secret: {secret}")
            self.stdout.write(
                self.style.WARNING(
                    "The webhook secret is shown once too. Toolgate keeps it (it signs every "
                    "webhook request with it); the agent host checks the signature with it."
                )
            )
        self.stdout.write("")
        for line in describe_policy(agent.current_policy):
            self.stdout.write(line)

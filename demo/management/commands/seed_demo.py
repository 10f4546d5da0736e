"""Seed a local database with demo orders, a demo agent and demo users; safe to run again."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from analytics.fills import rollups_fill
from approvals.models import ReviewerLimit
from demo.fixtures import (
    DEMO_AGENT_NAME,
    DEMO_BASE_URL,
    DEMO_ORDERS,
    DEMO_PASSWORD,
    DEMO_TOOLS,
    DEMO_USERS,
    RETAIL_AGENT_NAME,
    RETAIL_CUSTOMER,
    RETAIL_ORDER,
    RETAIL_TOKEN,
    DemoUser,
    demo_token,
)
from demo.history import demo_history_seed
from demo.queue import demo_queue_seed
from dispatch.management.policies import (
    DEFAULT_POLICY,
    PerCurrency,
    currency_limits,
    describe_policy,
    integer_in_range,
)
from dispatch.models import Agent, Policy
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import agent_create, agent_token_set, policy_create, token_hash
from orders.models import Order
from orders.services import order_create
from retail.loader import read_db, retail_load, retail_loaded
from retail.tools import RETAIL_TOOLS

# Characters that need no quoting in a shell or an Authorization header.
_TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9._~-]{16,128}$")


class Command(BaseCommand):
    help = (
        "Create demo orders, the agent 'demo-agent' with a fixed, documented token, the users "
        "admin, reviewer, reviewer2 and manager, a reviewer queue of held refunds in every "
        "state, and the retail desk's data with its agent 'retail-agent'. Idempotent. Refuses "
        "to run without DEBUG unless --force is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--token",
            default=demo_token(),
            help="the demo agent's token (default: $TOOLGATE_DEMO_TOKEN, or the documented "
            "demo value)",
        )
        parser.add_argument(
            "--password",
            default=DEMO_PASSWORD,
            help="the password of the demo users (default %(default)s)",
        )
        parser.add_argument(
            "--base-url",
            default=DEMO_BASE_URL,
            help="where the server runs, for the printed instructions (default %(default)s)",
        )
        parser.add_argument(
            "--history-sessions",
            type=integer_in_range(0, 100_000, "sessions"),
            default=settings.TOOLGATE_DEMO_HISTORY_SESSIONS,
            help="simulated sessions spread over the last 30 days, for the dashboards; 0 plays "
            "none (default %(default)s)",
        )
        parser.add_argument(
            "--migrate",
            action="store_true",
            help="apply the database's migrations first, in this process (make demo does)",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="seed even though DEBUG is off; never on a database that matters",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG and not options["force"]:
            raise CommandError(
                "seed_demo creates users with a published password and an agent with a "
                "published token, so it runs only with DEBUG on (the local settings). "
                "If this database is a throwaway, run it again with --force."
            )
        token: str = options["token"]
        if not _TOKEN_PATTERN.fullmatch(token):
            raise CommandError(
                "The token must be 16 to 128 characters of letters, digits and . _ ~ -"
            )
        password: str = options["password"]
        if not password:
            raise CommandError("The password must not be empty.")
        base_url = options["base_url"].rstrip("/")

        with _sqlite_unsynced():
            if options["migrate"]:
                call_command("migrate", stdout=self.stdout, verbosity=options["verbosity"])
            self._seed(token=token, password=password, history_sessions=options["history_sessions"])
        self._print_instructions(token=token, password=password, base_url=base_url)

    def _seed(self, *, token: str, password: str, history_sessions: int) -> None:
        with transaction.atomic():
            self._seed_orders()
            agent = self._seed_agent(token)
            self._seed_retail()
            users = self._seed_users(password)
        # After the commit: each decision commits on its own, and its execution runs then.
        demo_queue_seed(
            agent=agent,
            reviewer=users["reviewer"],
            second_reviewer=users["reviewer2"],
            say=self.stdout.write,
        )
        if history_sessions:
            demo_history_seed(
                agent=agent,
                reviewers=[users["reviewer"], users["reviewer2"]],
                say=self.stdout.write,
                sessions=history_sessions,
            )
        # Beat fills the rollups in production; here nothing else writes meanwhile, so every call
        # and decision just recorded is counted at once (a later call is read from its record).
        rollups_fill(lag=timedelta(0))

    def _seed_orders(self) -> None:
        existing = set(
            Order.objects.filter(order_id__in=[o.order_id for o in DEMO_ORDERS]).values_list(
                "order_id", flat=True
            )
        )
        self.stdout.write("Orders:")
        for demo in DEMO_ORDERS:
            if demo.order_id in existing:
                state = "already there, kept as it is"
            else:
                order_create(
                    order_id=demo.order_id,
                    customer_id=demo.customer_id,
                    total_cents=demo.total_cents,
                    currency=demo.currency,
                )
                state = "created"
            self.stdout.write(
                f"  {demo.order_id}  {demo.customer_id:<6} {demo.total_cents:>7} "
                f"{demo.currency}  {state}"
            )

    def _seed_agent(self, token: str) -> Agent:
        hashed = token_hash(token)
        other = Agent.objects.filter(token_hash=hashed).exclude(name=DEMO_AGENT_NAME).first()
        if other is not None:
            raise CommandError(
                f"That token already belongs to the agent {other.name!r}; pass another --token."
            )
        agent = Agent.objects.select_for_update().filter(name=DEMO_AGENT_NAME).first()
        if agent is None:
            agent, _ = agent_create(
                name=DEMO_AGENT_NAME,
                token=token,
                allowed_tools=DEMO_TOOLS,
                currencies=_demo_limits(),
                **DEFAULT_POLICY,
            )
            policy = agent.current_policy
            state = "created"
        else:
            agent_token_set(agent=agent, token=token)
            state = "already there; token set and agent active"
            policy = agent.current_policy
            if policy is None or not _is_demo_policy(policy):
                policy = policy_create(
                    agent=agent,
                    allowed_tools=DEMO_TOOLS,
                    currencies=_demo_limits(),
                    **DEFAULT_POLICY,
                )
                state += f"; demo policy set as v{policy.version}"
        assert policy is not None
        self.stdout.write(f"Agent {DEMO_AGENT_NAME}: {state}.")
        for line in describe_policy(policy):
            self.stdout.write(f"  {line}")
        return agent

    def _seed_retail(self) -> None:
        """The retail desk's data, if it is not loaded yet, and its agent beside the refund
        agent's, with a documented token of its own."""
        if retail_loaded():
            self.stdout.write("Retail data: already loaded.")
        else:
            loaded = retail_load(read_db())
            self.stdout.write(
                f"Retail data: {loaded.users} users, {loaded.orders} orders, "
                f"{loaded.products} products loaded."
            )
        tools = [*RETAIL_TOOLS, "get_confirmation_status"]
        agent = Agent.objects.select_for_update().filter(name=RETAIL_AGENT_NAME).first()
        if agent is None:
            agent, _ = agent_create(
                name=RETAIL_AGENT_NAME,
                token=RETAIL_TOKEN,
                allowed_tools=tools,
                currencies=_retail_limits(),
                **DEFAULT_POLICY,
            )
            state = "created"
        else:
            agent_token_set(agent=agent, token=RETAIL_TOKEN)
            state = "already there; token set and agent active"
            policy = agent.current_policy
            if policy is None or policy.limits() != _retail_limits():
                policy = policy_create(
                    agent=agent, allowed_tools=tools, currencies=_retail_limits(), **DEFAULT_POLICY
                )
                state += f"; retail policy set as v{policy.version}"
        assert agent.current_policy is not None
        self.stdout.write(f"Agent {RETAIL_AGENT_NAME}: {state}.")
        for line in describe_policy(agent.current_policy):
            self.stdout.write(f"  {line}")

    def _seed_users(self, password: str) -> dict[str, User]:
        # Hashed once for every demo user: each hash takes the password hasher's full work, and
        # the password is public anyway.
        hashed = make_password(password)
        users = {}
        for demo in DEMO_USERS:
            user = User.objects.filter(username=demo.username).first()
            if user is None:
                user = User.objects.create(
                    username=demo.username,
                    email=f"{demo.username}@example.com",
                    password=hashed,
                    # Only the administrator reaches the admin: reviewers and managers work
                    # from their own pages.
                    is_staff=demo.superuser,
                    is_superuser=demo.superuser,
                )
            else:
                user.password = hashed
                user.is_active = True
                user.is_staff = demo.superuser
                user.is_superuser = demo.superuser
                user.save(update_fields=["password", "is_active", "is_staff", "is_superuser"])
            if demo.group is not None:
                user.groups.add(_group(demo))
            _set_limits(user, demo.limit_cents)
            users[demo.username] = user
        return users

    def _print_instructions(self, *, token: str, password: str, base_url: str) -> None:
        body = json.dumps(
            {
                "session_id": "try-1",
                "customer_id": "CUS-1",
                "tool": "get_order",
                "arguments": {"order_id": "ORD-1001"},
            }
        )
        retail_body = json.dumps(
            {
                "session_id": "try-retail-1",
                "customer_id": RETAIL_CUSTOMER,
                "tool": "cancel_pending_order",
                "arguments": {"order_id": RETAIL_ORDER, "reason": "no longer needed"},
            }
        )
        lines = [
            "",
            self.style.SUCCESS("Demo data is ready. Local use only: all of it is public."),
            "",
            f"Log in at {base_url}/accounts/login/ with password {password!r}; each user lands on",
            "their page:",
            *(f"  {demo.username:<10}{base_url}{demo.start:<14}{demo.role}" for demo in DEMO_USERS),
            f"API docs: {base_url}/api/docs/",
            "",
            f"Demo agent token: {token}",
            "Try it while the server runs (make demo):",
            f"  curl -s {base_url}/api/v1/calls \\",
            f"    -H {shlex.quote(f'Authorization: Token {token}')} \\",
            "    -H 'Content-Type: application/json' \\",
            f"    -d {shlex.quote(body)}",
            f"Retail agent token: {RETAIL_TOKEN} (customer {RETAIL_CUSTOMER}, docs/retail.md)",
            "  its cancellation of the pending order " + RETAIL_ORDER + " is held for a reviewer:",
            f"  curl -s {base_url}/api/v1/calls \\",
            f"    -H {shlex.quote(f'Authorization: Token {RETAIL_TOKEN}')} \\",
            "    -H 'Content-Type: application/json' \\",
            f"    -d {shlex.quote(retail_body)}",
            "Simulate agents against it:",
            "  .venv/bin/python manage.py simulate_agents --sessions 50",
            "A model loop through it (the SDKs: .venv/bin/pip install -e '.[examples]'):",
            f"  TOOLGATE_URL={base_url} TOOLGATE_TOKEN={token} OPENAI_API_KEY=... \\",
            "    .venv/bin/python examples/openai_loop.py",
        ]
        for line in lines:
            self.stdout.write(line)


@contextmanager
def _sqlite_unsynced() -> Iterator[None]:
    """On SQLite, commit without waiting for the disk while seeding.

    The migrations and the history commit a few thousand transactions, one for each call and
    decision as in production, and waiting for each to reach the disk took most of the seed's
    time. A demo
    database that a power cut leaves broken mid-seed is deleted and seeded again."""

    def unsynced(*, connection: BaseDatabaseWrapper, **_: object) -> None:
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA synchronous = OFF")

    # Inside a transaction (a test's) nothing is committed to the disk until it ends anyway.
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        [previous] = cursor.fetchone()
    # Every connection opened meanwhile too: an execution's lease thread opens its own.
    connection_created.connect(unsynced)
    unsynced(connection=connection)
    try:
        yield
    finally:
        connection_created.disconnect(unsynced)
        if connection.connection is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA synchronous = {int(previous)}")


# The currencies of the demo's orders: its policy's thresholds and its reviewers' limits are in
# these; a call in any other is held for a human.
DEMO_CURRENCIES = ("BRL", "USD", "EUR")


# Above this, in each demo currency's major units, a reviewer's approval asks once more.
DEMO_CONFIRM_ABOVE = "200"


def _demo_limits() -> dict[str, CurrencyLimits]:
    """The default thresholds, in major units, for each currency the demo's orders use, and an
    approval's second look above 200."""
    second_look = [PerCurrency(currency, DEMO_CONFIRM_ABOVE) for currency in DEMO_CURRENCIES]
    return currency_limits({"confirm_above": second_look}, DEMO_CURRENCIES)


def _retail_limits() -> dict[str, CurrencyLimits]:
    """The retail desk moves dollars only: up to $5,000 a call (its dearest orders pass $500),
    without a human below $50, two reviewers from $1,000, a second look above $200."""
    chosen = {
        "max_amount": [PerCurrency("USD", "5000")],
        "two_reviewers_from": [PerCurrency("USD", "1000")],
        "confirm_above": [PerCurrency("USD", DEMO_CONFIRM_ABOVE)],
    }
    return currency_limits(chosen, ("USD",))


def _is_demo_policy(policy: Policy) -> bool:
    return (
        sorted(policy.allowed_tools) == sorted(DEMO_TOOLS)
        and policy.limits() == _demo_limits()
        and not policy.human_rules
        and all(getattr(policy, field) == value for field, value in DEFAULT_POLICY.items())
    )


def _set_limits(user: User, limit_cents: int | None) -> None:
    if limit_cents is None:
        ReviewerLimit.objects.filter(reviewer=user).delete()
        return
    for currency in DEMO_CURRENCIES:
        ReviewerLimit.objects.update_or_create(
            reviewer=user, currency=currency, defaults={"max_amount_cents": limit_cents}
        )


def _group(demo: DemoUser) -> Group:
    assert demo.group is not None
    group, _ = Group.objects.get_or_create(name=demo.group)
    wanted: list[Permission] = []
    for name in demo.group_permissions:
        app_label, codename = name.split(".")
        wanted.extend(
            Permission.objects.filter(content_type__app_label=app_label, codename=codename)
        )
    group.permissions.add(*wanted)
    return group

"""Migrations that fill data: run from the state before them, on rows made as they were then."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from analytics.replay import policy_what_if
from dispatch.models import Agent, Policy
from dispatch.pipeline.allowance import execution_key
from orders.models import Order
from tests.conftest import Run

BEFORE_HELD_MONEY = ("dispatch", "0014_security_event_channel_host_key_session")
HELD_MONEY = ("dispatch", "0015_held_money")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def migrated_back() -> Iterator[Apps]:
    """The models as they were before the held money's migration; the schema is moved forward
    again after the test."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE_HELD_MONEY])
    yield executor.loader.project_state([BEFORE_HELD_MONEY]).apps
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_migration_reserves_the_money_of_confirmations_still_on_their_way(
    migrated_back: Apps,
) -> None:
    Agent = migrated_back.get_model("dispatch", "Agent")
    Confirmation = migrated_back.get_model("dispatch", "Confirmation")
    agent = Agent.objects.create(name="old", token_prefix="tg_old", token_hash="0" * 64)
    now = timezone.now()

    def held(confirmation_id: str, status: str, amount_cents: int | None = 6_000) -> Any:
        return Confirmation.objects.create(
            id=confirmation_id,
            key=f"key-{confirmation_id}",
            tool="refund_order",
            arguments={
                "order_id": "ORD-1001",
                "amount_cents": amount_cents or 0,
                "currency": "BRL",
                "reason": "damaged",
            },
            arguments_hash="h",
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            policy_version=1,
            amount_cents=amount_cents,
            status=status,
            created_at=now,
            expires_at=now + timedelta(hours=1),
        )

    pending, approved, executing = (
        held("a" * 32, "pending"),
        held("b" * 32, "approved"),
        held("c" * 32, "executing"),
    )
    for status, letter in (("rejected", "d"), ("expired", "e"), ("failed", "f")):
        held(letter * 32, status)
    held("9" * 32, "pending", amount_cents=None)

    executor = MigrationExecutor(connection)
    executor.migrate([HELD_MONEY])
    Movement = executor.loader.project_state([HELD_MONEY]).apps.get_model("dispatch", "Movement")

    reserved = {
        row.key: (row.approval, row.amount_cents, row.currency, row.subject, row.expires_at)
        for row in Movement.objects.all()
    }
    assert reserved == {
        execution_key(pending.pk): ("held", 6_000, "BRL", "ORD-1001", pending.expires_at),
        execution_key(approved.pk): ("approved", 6_000, "BRL", "ORD-1001", None),
        execution_key(executing.pk): ("approved", 6_000, "BRL", "ORD-1001", None),
    }


def test_the_policy_versions_per_currency_judge_the_demos_traffic_as_the_old_ones(
    run: Run,
) -> None:
    run("seed_demo", "--force", "--history-sessions", "120")
    agent = Agent.objects.get(name="demo-agent")
    recorded = agent.current_policy
    assert recorded is not None
    # The version as it was before thresholds were kept per currency: one set for all.
    old = Policy.objects.create(
        agent=agent,
        version=recorded.version + 1,
        allowed_tools=recorded.allowed_tools,
        currency_limits=None,
        max_amount_cents=50_000,
        auto_approve_below_cents=5_000,
        two_reviewers_from_cents=30_000,
        daily_cap_cents=None,
    )
    agent.current_policy = old
    agent.save(update_fields=["current_policy"])

    migration = importlib.import_module("dispatch.migrations.0017_policies_per_currency")
    migration._versions_per_currency(django_apps, None)

    agent.refresh_from_db()
    new = agent.current_policy
    assert new is not None and new.version == old.version + 1
    assert set(new.limits() or {}) == set(Order.objects.values_list("currency", flat=True))
    now = timezone.now()
    under = {
        version.version: policy_what_if(
            agent_id=agent.pk,
            since=now - timedelta(days=31),
            until=now,
            draft=version.snapshot(),
        )
        for version in (old, new)
    }
    assert under[old.version].calls == under[new.version].calls > 0
    # The version per currency judges every call as the version it replaced did.
    assert under[old.version].moves == under[new.version].moves


BEFORE_CHAINS = [
    ("dispatch", "0019_least_privilege"),
    ("approvals", "0006_webhook_next_attempt"),
]


def test_the_migrations_chain_the_records_and_events_made_before_them(run: Run) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_CHAINS)
    old = executor.loader.project_state(BEFORE_CHAINS).apps
    Agent = old.get_model("dispatch", "Agent")
    Session = old.get_model("dispatch", "Session")
    AuditRecord = old.get_model("dispatch", "AuditRecord")
    Confirmation = old.get_model("dispatch", "Confirmation")
    Event = old.get_model("approvals", "ConfirmationEvent")
    agent = Agent.objects.create(name="old", token_prefix="tg_old", token_hash="1" * 64)
    now = timezone.now()
    for session in ("s-1", "s-2"):
        Session.objects.create(agent=agent, session_id=session, customer_id="CUS-1", steps=2)
    for number, session in enumerate(["s-1", "s-2", "s-1", "s-1"]):
        AuditRecord.objects.create(
            call_id=f"call-{number}",
            at=now + timedelta(seconds=number),
            agent=agent,
            session_id=session,
            customer_id="CUS-1",
            step=number,
            tool="get_order",
            arguments={"order_id": "ORD-1001", "amount": 1.5},
            ok=True,
            code="OK",
            policy_version=1,
            duration_ms=1.25,
        )
    held = Confirmation.objects.create(
        id="c" * 32,
        key="k" * 64,
        tool="refund_order",
        arguments={},
        arguments_hash="h",
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        policy_version=1,
        created_at=now,
        expires_at=now + timedelta(hours=1),
        status="rejected",
    )
    for kind in ("voted", "rejected"):
        Event.objects.create(confirmation=held, at=now, kind=kind, actor_label="ana")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from approvals.models import ConfirmationEvent
    from dispatch.models import AuditRecord as Record
    from dispatch.models import Confirmation as Current

    assert list(Record.objects.order_by("id").values_list("session_id", "chain_seq")) == [
        ("s-1", 1),
        ("s-2", 1),
        ("s-1", 2),
        ("s-1", 3),
    ]
    assert list(ConfirmationEvent.objects.values_list("chain_seq", flat=True)) == [1, 2]
    assert Current.objects.get().event_seq == 2
    # Signed under the audit key by the migrations that added the MAC, so they verify.
    assert all(Record.objects.values_list("chain_mac", flat=True))
    assert all(ConfirmationEvent.objects.values_list("chain_mac", flat=True))
    assert "OK: every chain holds" in run("verify_audit")

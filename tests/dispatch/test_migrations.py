"""Migrations that fill data: run from the state before them, on rows made as they were then."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from dispatch.pipeline.allowance import execution_key

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

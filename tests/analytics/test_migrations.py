"""The rollups' move to analytics: from the state before it, with rows in the tables, the rows
are analytics' afterwards, in the same tables, and so are their permissions. And the hand-over to
the fills: what the release before counted is refilled from the records."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.apps.registry import Apps
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from analytics.fills import CALLS, rollups_fill
from analytics.models import (
    CallRollup,
    CallRollupDay,
    DecisionRollup,
    FillProgress,
    FillState,
    PendingRecovery,
)
from dispatch.services import call_dispatch
from tests.conftest import MakeAgent

BEFORE_THE_MOVE: list[tuple[str, str | None]] = [
    ("dispatch", "0015_held_money"),
    ("analytics", None),
]
THE_MOVE = [("dispatch", "0016_rollups_move_to_analytics")]
BEFORE_THE_FILLS = [("analytics", "0001_initial")]
HOUR = datetime(2026, 12, 3, 10, tzinfo=UTC)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def migrated_back() -> Iterator[Apps]:
    """The models as they were before the move; the schema is moved forward again after the
    test."""
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_THE_MOVE)
    yield executor.loader.project_state(("dispatch", "0015_held_money")).apps
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def dispatch_model(apps: Apps, name: str) -> Any:
    """One of dispatch's models as they were then (some are no longer dispatch's)."""
    return apps.get_model("dispatch", name)


def test_the_rollups_rows_are_analytics_after_the_move(migrated_back: Apps) -> None:
    agent = dispatch_model(migrated_back, "Agent").objects.create(
        name="old", token_prefix="tg_old", token_hash="0" * 64
    )
    counts = {"tool": "get_order", "code": "OK", "calls": 3, "replayed": 1}
    dispatch_model(migrated_back, "CallRollup").objects.create(agent=agent, hour=HOUR, **counts)
    dispatch_model(migrated_back, "CallRollupDay").objects.create(
        agent=agent, day=HOUR.date(), **counts
    )
    dispatch_model(migrated_back, "DecisionRollup").objects.create(
        agent=agent, day=HOUR.date(), tool="refund_order", decided_by="rita", bucket=9, decisions=2
    )
    dispatch_model(migrated_back, "PendingRecovery").objects.create(
        agent=agent, session_id="s-1", step=4, tool="get_order", code="INVALID_ARGUMENTS", hour=HOUR
    )
    old_type = migrated_back.get_model("contenttypes", "ContentType").objects.get(
        app_label="dispatch", model="callrollup"
    )

    executor = MigrationExecutor(connection)
    executor.migrate(THE_MOVE)

    assert list(CallRollup.objects.values_list("agent_id", "hour", "calls", "replayed")) == [
        (agent.pk, HOUR, 3, 1)
    ]
    assert list(CallRollupDay.objects.values_list("day", "calls")) == [(date(2026, 12, 3), 3)]
    assert list(DecisionRollup.objects.values_list("decided_by", "bucket", "decisions")) == [
        ("rita", 9, 2)
    ]
    assert list(PendingRecovery.objects.values_list("session_id", "step")) == [("s-1", 4)]
    assert CallRollup._meta.db_table == "dispatch_callrollup"
    assert ContentType.objects.get(pk=old_type.pk).app_label == "analytics"


@pytest.fixture
def before_the_fills() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_THE_FILLS)
    yield MigrationExecutor(connection)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.usefixtures("orders")
def test_the_first_fill_refills_what_the_release_before_counted(
    make_agent: MakeAgent, before_the_fills: MigrationExecutor
) -> None:
    agent, _ = make_agent()
    call_dispatch(
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        tool="get_order",
        arguments='{"order_id": "ORD-1001"}',
    )
    # The release before counted the call with its own statement, and once more from a process
    # that still ran it after the migration.
    CallRollup.objects.create(agent=agent, hour=HOUR, tool="get_order", code="OK", calls=2)

    before_the_fills.migrate(before_the_fills.loader.graph.leaf_nodes())
    marked = FillState.objects.get(property=CALLS).state
    rollups_fill(lag=timedelta(0))

    assert marked == FillProgress.STARTED
    assert list(CallRollup.objects.values_list("code", "calls")) == [("OK", 1)]

"""simulate_agents against a real server: pytest-django's live server, seeded with the demo."""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Callable

import pytest
from django.core.management.base import CommandError
from django.db.models import Sum
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer

from analytics.recovery import Recovery, recovery_rate
from demo.fixtures import DEMO_AGENT_NAME, DEMO_TOKEN
from demo.simulation import SCENARIOS
from dispatch.models import Agent, AuditRecord
from orders.models import Order, Refund
from tests.conftest import Run

pytestmark = pytest.mark.django_db

Simulate = Callable[..., str]

EVERY_SCENARIO_ONCE = ",".join(f"{name}=1" for name in SCENARIOS)


def codes_in_summary(output: str) -> Counter[str]:
    """The "Outcomes by code" table of the summary, read back."""
    table: Counter[str] = Counter()
    lines = output.split("Outcomes by code", 1)[1].splitlines()[2:]
    for line in lines:
        if not line.strip():
            break
        code, calls, _percent = line.split()
        if code != "total":
            table[code] = int(calls)
    return table


def recovery_in_summary(output: str) -> dict[str, Recovery]:
    """The "Recovery by code" table of the summary, read back."""
    table: dict[str, Recovery] = {}
    for line in output.split("Recovery by code:", 1)[1].splitlines()[2:]:
        if not line.strip():
            break
        code, rejected, recovered, _rate = line.split()
        table[code] = Recovery(int(rejected), int(recovered))
    return table


@pytest.fixture
def simulate(run: Run, live_server: LiveServer, transactional_db: None) -> Simulate:
    run("seed_demo", "--force", "--token", DEMO_TOKEN)

    def call(*args: str) -> str:
        return run("simulate_agents", "--base-url", live_server.url, "--token", DEMO_TOKEN, *args)

    return call


def test_its_summary_counts_exactly_the_audit_records_it_caused(simulate: Simulate) -> None:
    before = AuditRecord.objects.count()

    output = simulate(
        "--sessions", str(len(SCENARIOS)), "--seed", "7", "--mix", EVERY_SCENARIO_ONCE
    )

    created = Counter(AuditRecord.objects.order_by("id")[before:].values_list("code", flat=True))
    assert codes_in_summary(output) == created
    assert f"{len(SCENARIOS)} sessions, {created.total()} calls" in output
    assert {
        "OK",
        "INVALID_ARGUMENTS",
        "ORDER_NOT_FOUND",
        "CURRENCY_MISMATCH",
        "LOOP_DETECTED",
    } <= set(created)
    by_scenario = output.split("By scenario:", 1)[1]
    for name in SCENARIOS:
        assert f"  {name} " in by_scenario
    assert "Recovery rate:" in output


def test_its_recovery_rate_is_read_from_the_audit_records_of_the_run(
    simulate: Simulate,
) -> None:
    started = timezone.now()

    output = simulate(
        "--sessions",
        "12",
        "--seed",
        "4",
        "--mix",
        "float_amount=1,string_amount=1,sloppy_value=1,missing_field=1",
    )

    agent = Agent.objects.get(name=DEMO_AGENT_NAME)
    rate = recovery_rate(start=started, end=timezone.now(), agent_id=agent.pk)
    assert rate.overall.rejected > 0
    assert recovery_in_summary(output) == rate.by_code
    assert (
        f"({rate.overall.recovered} of {rate.overall.rejected} rejections the model can fix"
        in output
    )
    # Each of these mistakes gets a message that says what to send, and the model sends it.
    assert rate.by_code["INVALID_ARGUMENTS"].recovered == rate.by_code["INVALID_ARGUMENTS"].rejected


def test_it_leaves_the_ledger_adding_up(simulate: Simulate) -> None:
    simulate("--sessions", "8", "--seed", "3", "--mix", "good=3,refund_for_read=1")

    assert Refund.objects.exists()
    for order in Order.objects.all():
        ledger = order.refunds.aggregate(total=Sum("amount_cents"))["total"] or 0
        assert ledger == order.refunded_cents <= order.total_cents


def test_its_session_ids_are_unique_per_run(simulate: Simulate) -> None:
    # The demo's own queue was seeded through the pipeline too.
    seeded = set(AuditRecord.objects.values_list("session_id", flat=True))

    simulate("--sessions", "2", "--seed", "5", "--mix", "good=1")
    simulate("--sessions", "2", "--seed", "5", "--mix", "good=1")

    session_ids = set(AuditRecord.objects.values_list("session_id", flat=True)) - seeded
    assert len(session_ids) == 4
    assert all(session_id.startswith("sim-") for session_id in session_ids)


def test_it_tells_to_start_the_server_when_none_answers(run: Run) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Order.objects.create(order_id="ORD-1", customer_id="CUS-1", total_cents=100, currency="BRL")

    with pytest.raises(CommandError, match="make demo"):
        run("simulate_agents", "--sessions", "1", "--base-url", f"http://127.0.0.1:{port}")


def test_it_tells_how_to_fix_a_refused_token(
    run: Run, live_server: LiveServer, transactional_db: None
) -> None:
    run("seed_demo", "--force", "--token", DEMO_TOKEN)

    with pytest.raises(CommandError, match="seed_demo"):
        run(
            "simulate_agents",
            "--sessions",
            "1",
            "--base-url",
            live_server.url,
            "--token",
            "tg_not_a_token_of_anyone",
        )


@pytest.mark.parametrize(
    ("mix", "error"),
    [
        ("good=1,teleport=2", "Unknown scenario 'teleport'"),
        ("good=many", "whole weight"),
        ("good=0", "at least one scenario"),
    ],
)
def test_it_refuses_a_bad_mix(run: Run, mix: str, error: str) -> None:
    with pytest.raises(CommandError, match=error):
        run("simulate_agents", "--sessions", "1", "--mix", mix)


def test_it_plays_only_the_orders_it_is_given(simulate: Simulate) -> None:
    orders = json.dumps(
        [{"order_id": "ORD-1001", "customer_id": "CUS-1", "total_cents": 12000, "currency": "BRL"}]
    )

    before = AuditRecord.objects.count()

    simulate("--sessions", "3", "--seed", "1", "--mix", "good=1", "--orders", orders)

    played = AuditRecord.objects.order_by("id")[before:].values_list("customer_id", flat=True)
    assert set(played) == {"CUS-1"}


@pytest.mark.parametrize(
    ("orders", "error"),
    [
        ("[{", "not JSON"),
        ('[{"order_id": "ORD-1"}]', "needs order_id"),
        ("@/nonexistent.json", "cannot read"),
    ],
)
def test_it_refuses_orders_it_cannot_read(run: Run, orders: str, error: str) -> None:
    with pytest.raises(CommandError, match=error):
        run("simulate_agents", "--sessions", "1", "--orders", orders)

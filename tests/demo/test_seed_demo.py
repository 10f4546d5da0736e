from __future__ import annotations

import importlib
import json
import re
import shlex
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.utils import timezone
from pytest_django.fixtures import Settings

from analytics.replay import policy_what_if
from analytics.rollups import audit_in_session_order, rollups_live, rollups_rebuilt
from approvals.selectors import effective_status
from demo.fixtures import DEMO_TOKEN, RETAIL_AGENT_NAME, RETAIL_CUSTOMER, RETAIL_ORDER, RETAIL_TOKEN
from dispatch.models import Agent, AuditRecord, Confirmation, Policy
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import agent_authenticate, agent_create, token_hash
from orders.models import Order
from retail.models import RetailOrder
from retail.tools import RETAIL_TOOLS
from tests.conftest import Run

pytestmark = pytest.mark.django_db


def test_it_refuses_to_run_without_debug(run: Run, settings: Settings) -> None:
    settings.DEBUG = False

    with pytest.raises(CommandError, match="--force"):
        run("seed_demo")

    assert not Order.objects.exists()
    assert not User.objects.exists()
    assert not Agent.objects.exists()


def test_it_runs_with_debug_on(run: Run, settings: Settings) -> None:
    settings.DEBUG = True

    run("seed_demo")

    assert Order.objects.filter(order_id="ORD-1001").exists()


def test_the_local_settings_that_make_demo_uses_have_debug_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEBUG", raising=False)

    local = importlib.reload(importlib.import_module("toolgate.settings.local"))

    assert local.DEBUG is True


def test_it_creates_the_demo_orders(run: Run) -> None:
    run("seed_demo", "--force")

    first = Order.objects.get(order_id="ORD-1001")
    second = Order.objects.get(order_id="ORD-1002")
    assert (first.customer_id, first.total_cents, first.currency) == ("CUS-1", 12_000, "BRL")
    assert (second.customer_id, second.total_cents, second.currency) == ("CUS-2", 4_500, "USD")
    assert Order.objects.count() >= 6
    assert Order.objects.values("customer_id").distinct().count() >= 3
    assert set(Order.objects.values_list("currency", flat=True)) == {"BRL", "USD", "EUR"}


def test_it_creates_the_demo_agent_with_the_documented_token_stored_as_a_hash(run: Run) -> None:
    output = run("seed_demo", "--force")

    agent = Agent.objects.get(name="demo-agent")
    assert agent_authenticate(DEMO_TOKEN) == agent
    assert agent.token_hash == token_hash(DEMO_TOKEN)
    assert DEMO_TOKEN in output
    policy = agent.current_policy
    assert policy is not None
    assert sorted(policy.allowed_tools) == [
        "get_confirmation_status",
        "get_order",
        "refund_order",
        "refund_order_v2",
    ]
    # Per currency of the demo's orders, in each one's minor units: 500.00, 50.00 and 300.00.
    demo = CurrencyLimits(50_000, 5_000, 30_000, None, confirm_above_cents=20_000)
    assert policy.limits() == {"BRL": demo, "EUR": demo, "USD": demo}


def test_it_creates_the_users_in_their_groups(run: Run, client: Client) -> None:
    run("seed_demo", "--force", "--password", "s3cret-demo")

    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert list(User.objects.get(username="reviewer").groups.values_list("name", flat=True)) == [
        "reviewers"
    ]
    assert list(User.objects.get(username="manager").groups.values_list("name", flat=True)) == [
        "managers"
    ]
    # A second manager, to approve the policy changes the first drafts.
    assert list(User.objects.get(username="manager2").groups.values_list("name", flat=True)) == [
        "managers"
    ]
    for username in ("admin", "reviewer", "manager", "manager2"):
        assert User.objects.get(username=username).check_password("s3cret-demo")
    # Only the administrator reaches the admin.
    staff = set(User.objects.filter(is_staff=True).values_list("username", flat=True))
    assert staff == {"admin"}
    client.force_login(User.objects.get(username="manager"))
    assert client.get("/admin/").status_code == 302
    assert client.login(username="admin", password="s3cret-demo")
    assert client.get("/admin/").status_code == 200


def test_the_reviewer_and_the_manager_see_only_what_their_group_may(
    run: Run, client: Client
) -> None:
    run("seed_demo", "--force")

    # Their own pages, and no page of the admin: only the administrator is staff.
    assert client.login(username="reviewer", password="toolgate-demo")
    assert client.get("/approvals/").status_code == 200
    assert client.get("/records/confirmations/").status_code == 403
    assert client.get("/admin/dispatch/confirmation/").status_code == 302
    assert client.login(username="manager", password="toolgate-demo")
    assert client.get("/records/orders/").status_code == 200
    assert client.get("/analytics/").status_code == 200
    assert client.get("/admin/dispatch/auditrecord/").status_code == 302
    assert client.get("/admin/dispatch/policy/add/").status_code == 302


def test_it_is_idempotent(run: Run) -> None:
    run("seed_demo", "--force")
    before = (
        Order.objects.count(),
        Agent.objects.count(),
        Policy.objects.count(),
        User.objects.count(),
    )

    output = run("seed_demo", "--force")

    after = (
        Order.objects.count(),
        Agent.objects.count(),
        Policy.objects.count(),
        User.objects.count(),
    )
    assert after == before
    assert "already there" in output
    assert agent_authenticate(DEMO_TOKEN) is not None
    assert User.objects.get(username="reviewer").groups.count() == 1


def test_it_keeps_an_order_that_is_already_there(run: Run) -> None:
    Order.objects.create(order_id="ORD-1001", customer_id="CUS-1", total_cents=999, currency="BRL")

    run("seed_demo", "--force")

    assert Order.objects.get(order_id="ORD-1001").total_cents == 999


def test_it_sets_the_token_of_an_existing_demo_agent(run: Run) -> None:
    agent, old_token = agent_create(
        name="demo-agent", allowed_tools=["get_order"], max_amount_cents=100
    )
    agent.is_active = False
    agent.save(update_fields=["is_active"])

    output = run("seed_demo", "--force", "--token", "tg_another_demo_token_42")

    agent.refresh_from_db()
    assert agent_authenticate("tg_another_demo_token_42") == agent
    assert agent_authenticate(old_token) is None
    assert agent.current_policy is not None
    assert agent.current_policy.version == 2
    assert sorted(agent.current_policy.allowed_tools) == [
        "get_confirmation_status",
        "get_order",
        "refund_order",
        "refund_order_v2",
    ]
    assert "tg_another_demo_token_42" in output


def test_its_token_defaults_to_the_environment(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLGATE_DEMO_TOKEN", "tg_from_the_environment_1")

    run("seed_demo", "--force")

    assert agent_authenticate("tg_from_the_environment_1") is not None
    assert agent_authenticate(DEMO_TOKEN) is None


def test_it_refuses_a_token_that_cannot_go_in_a_header(run: Run) -> None:
    with pytest.raises(CommandError, match="token must be"):
        run("seed_demo", "--force", "--token", "short")

    assert not Agent.objects.exists()


def test_its_curl_example_works(run: Run, client: Client) -> None:
    output = run("seed_demo", "--force")

    curl = re.search(r"curl -s (\S+) \\\n(.*?)\n(?!\s)", output + "\nend", re.S)
    assert curl is not None, output
    words = shlex.split(curl.group(0).replace("\\\n", " "))
    headers = dict(words[i + 1].split(": ", 1) for i, w in enumerate(words) if w == "-H")
    body = words[words.index("-d") + 1]
    response = client.post(
        curl.group(1).removeprefix("http://127.0.0.1:8000"),
        data=body,
        content_type=headers["Content-Type"],
        HTTP_AUTHORIZATION=headers["Authorization"],
    )
    assert response.status_code == 200, response.content
    result = response.json()
    assert (result["ok"], result["code"]) == (True, "OK")
    assert result["data"]["order_id"] == json.loads(body)["arguments"]["order_id"]


# Committed for real, as `make demo` does: each approval's execution runs once it commits.
@pytest.mark.django_db(transaction=True)
def test_it_fills_the_reviewer_queue_with_every_state_once(run: Run, client: Client) -> None:
    output = run("seed_demo", "--force")
    again = run("seed_demo", "--force")

    statuses = sorted(effective_status(confirmation) for confirmation in Confirmation.objects.all())
    assert statuses == sorted(
        ["pending"] * 4 + ["executed", "rejected", "expired", "failed", "unknown"]
    )
    # The rejected EUR refund of CUS-3 needed two too: with the 350,00 held, its sum passed 300,00.
    two_reviewers = Confirmation.objects.get(reviewers_required=2, status="pending")
    assert effective_status(two_reviewers) == "pending"
    assert [vote.reviewer.username for vote in two_reviewers.votes.all()] == ["reviewer2"]
    assert Confirmation.objects.exclude(host_context="").exists()
    assert "already there, kept as they are" in again
    assert "reviewer  http://127.0.0.1:8000/approvals/" in output
    assert "manager   http://127.0.0.1:8000/analytics/ " in output
    assert client.login(username="reviewer", password="toolgate-demo")
    queue = client.get("/approvals/").content.decode()
    assert queue.count('<article class="item') == 4
    assert "Expires soon" in queue


# Committed for real, as `make demo` does: on PostgreSQL each call reserves its money on a
# connection of its own, which sees the decisions made before it only once they committed.
@pytest.mark.django_db(transaction=True)
def test_its_history_spreads_the_traffic_over_30_days_through_the_pipeline(run: Run) -> None:
    output = run("seed_demo", "--force", "--history-sessions", "40")
    again = run("seed_demo", "--force", "--history-sessions", "40")

    history = AuditRecord.objects.filter(session_id__startswith="sim-history-")
    moments = sorted(history.values_list("at", flat=True))
    now = timezone.now()
    assert "40/40 sessions" in output and "already there, kept as it is" in again
    assert history.values("session_id").distinct().count() == 40
    assert now - timedelta(days=30) <= moments[0] and moments[-1] < now
    assert moments[-1] - moments[0] > timedelta(days=15)
    # Held refunds were decided by the demo reviewers after they were held, within a day.
    decided = Confirmation.objects.filter(
        session_id__startswith="sim-history-", decided_at__isnull=False
    )
    assert decided.exists()
    for confirmation in decided:
        assert confirmation.decided_at is not None
        assert timedelta(0) < confirmation.decided_at - confirmation.created_at <= timedelta(days=1)
    # Counted as calls are written, the rollups agree with the records they came from.
    assert rollups_live() == rollups_rebuilt(audit_in_session_order())[0]
    # An approved refund executed at its approval, as a worker would, not when it was seeded.
    executed = decided.filter(status="executed")
    assert executed.exists()
    for confirmation in executed:
        assert confirmation.finished_at == confirmation.decided_at
    # Judged again under the policy that judged them, every call of any range goes the way it
    # went.
    agent = Agent.objects.get(name="demo-agent")
    assert agent.current_policy is not None
    for days in (1, 7, 31):
        replay = policy_what_if(
            agent_id=agent.pk,
            since=now - timedelta(days=days),
            until=now,
            draft=agent.current_policy.snapshot(),
        )
        assert (days, replay.moves) == (days, ())
    assert replay.calls > 0


def test_it_loads_the_retail_desk_and_its_agent_beside_the_refund_agent(run: Run) -> None:
    output = run("seed_demo", "--force", "--history-sessions", "0")
    again = run("seed_demo", "--force", "--history-sessions", "0")

    agent = Agent.objects.get(name=RETAIL_AGENT_NAME)
    assert agent_authenticate(RETAIL_TOKEN) == agent
    assert agent.current_policy is not None
    assert set(agent.current_policy.allowed_tools) == {*RETAIL_TOOLS, "get_confirmation_status"}
    assert agent.policies.count() == 1
    assert RetailOrder.objects.count() == 1000
    assert RetailOrder.objects.get(order_id=RETAIL_ORDER).user.user_id == RETAIL_CUSTOMER
    assert "Retail data: 500 users, 1000 orders, 50 products loaded." in output
    assert "Retail data: already loaded." in again
    assert RETAIL_TOKEN in output


# Committed for real: the seed's commits do not wait for the disk, and the wait is put back after.
@pytest.mark.django_db(transaction=True)
def test_it_leaves_sqlite_waiting_for_the_disk_as_before(run: Run) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the wait for the disk is SQLite's")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        [before] = cursor.fetchone()

    run("seed_demo", "--force")

    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone() == (before,)
    assert before != 0


# Committed for real: migrate runs outside any transaction, as `make demo` runs it.
@pytest.mark.django_db(transaction=True)
def test_it_migrates_first_when_asked_as_make_demo_does(run: Run) -> None:
    output = run("seed_demo", "--force", "--migrate")

    assert output.index("No migrations to apply") < output.index("Orders:")
    assert Order.objects.filter(order_id="ORD-1001").exists()

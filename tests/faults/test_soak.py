"""A bounded soak: `manage.py simulate_agents` plays sessions against gunicorn for about a minute
while a reviewer approves and rejects the held refunds as they come, and a Celery worker (with the
beat) executes the approved ones. It ends on the invariants: every order's ledger adds up to its
refunded amount, one audit record per call the simulation counted, every approved confirmation
executed once, none left approved or executing.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.models import Count

from approvals.models import ConfirmationEvent
from approvals.selectors import REVIEWERS_GROUP
from approvals.services import ConfirmationError, confirmation_approve, confirmation_reject
from dispatch.models import Agent, AuditRecord, Confirmation, ConfirmationStatus
from orders.models import Order, Refund
from tests.conftest import Figures, MakeAgent
from tests.factories import OrderFactory
from tests.faults.conftest import StartWeb, ledger_doubles
from tests.workers import ROOT, StartWorker, database_url, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.faults,
    pytest.mark.timeout(300),
]

SOAK_SECONDS = float(os.environ.get("TOOLGATE_SOAK_SECONDS", "60"))
OUTBOX = {
    "TOOLGATE_EXECUTION_SWEEP_SECONDS": "1",
    "TOOLGATE_EXECUTION_RESEND_SECONDS": "2",
    "TOOLGATE_EXECUTION_LEASE_SECONDS": "3",
}
STUCK = {ConfirmationStatus.APPROVED, ConfirmationStatus.EXECUTING}


class Reviewer(threading.Thread):
    """Decides the agent's pending confirmations as they come: approves two in three."""

    def __init__(self, agent: Agent, person: User) -> None:
        super().__init__(daemon=True)
        self.agent, self.person = agent, person
        self.stop = threading.Event()
        self.decided: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            while not self.stop.is_set():
                pending = list(
                    Confirmation.objects.filter(
                        agent=self.agent, status=ConfirmationStatus.PENDING
                    ).values_list("pk", flat=True)[:10]
                )
                for pk in pending:
                    self._decide(pk, approve=rng.random() < 2 / 3)
                time.sleep(0.2)
        except BaseException as error:
            self.error = error
        finally:
            connection.close()

    def _decide(self, pk: str, *, approve: bool) -> None:
        try:
            if approve:
                confirmation_approve(confirmation_id=pk, reviewer=self.person)
                self.decided["approve votes"] += 1
            else:
                confirmation_reject(confirmation_id=pk, reviewer=self.person, reason="not owed")
                self.decided["rejected"] += 1
        except ConfirmationError as refusal:
            # Expired meanwhile, a possible duplicate, past the reviewer's limit...
            self.decided[f"refused: {type(refusal).__name__}"] += 1


def simulate(url: str, token: str, seed: int) -> str:
    completed = subprocess.run(
        [
            *(sys.executable, "manage.py", "simulate_agents"),
            *("--base-url", url, "--token", token, "--sessions", "24"),
            *("--concurrency", "4", "--seed", str(seed)),
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
            "DATABASE_URL": database_url(),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def audited_calls(summary: str) -> int:
    """The "total" of the summary's outcomes by code: the calls with an audit record each."""
    table = summary.split("Outcomes by code", 1)[1]
    match = re.search(r"^\s+total\s+(\d+)", table, re.MULTILINE)
    assert match, summary
    return int(match.group(1))


def test_a_minute_of_simulated_agents_with_reviewers_deciding_ends_on_the_invariants(
    start_web: StartWeb,
    start_worker: StartWorker,
    broker: str,
    make_agent: MakeAgent,
    figures: Figures,
) -> None:
    web = start_web(
        workers=2,
        redis_url=broker,
        # simulate_agents talks to gunicorn directly, without nginx's headers.
        ALLOWED_HOSTS="localhost,127.0.0.1",
        SECURE_SSL_REDIRECT="false",
        **OUTBOX,
    )
    start_worker(beat=True, **OUTBOX)
    agent, token = make_agent(auto_approve_below_cents=5_000)
    orders = [
        OrderFactory.create(
            order_id=f"ORD-{6000 + i}", customer_id=f"CUS-{600 + i % 12}", total_cents=30_000
        )
        for i in range(36)
    ]
    person = User.objects.create_user("soak-reviewer", password="pw")
    person.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    reviewer = Reviewer(agent, person)
    reviewer.start()

    started = time.monotonic()
    runs, calls = 0, 0
    while time.monotonic() - started < SOAK_SECONDS:
        calls += audited_calls(simulate(web.url, token, seed=runs))
        runs += 1
    soak_seconds = time.monotonic() - started
    reviewer.stop.set()
    reviewer.join(timeout=30)
    assert reviewer.error is None, reviewer.error

    # What was approved executes within the outbox's bound.
    wait_until(
        lambda: not Confirmation.objects.filter(agent=agent, status__in=STUCK).exists(),
        "the approved confirmations to execute",
        timeout=60,
    )
    settled_seconds = time.monotonic() - started - soak_seconds

    statuses = Counter(Confirmation.objects.filter(agent=agent).values_list("status", flat=True))
    approved = set(
        ConfirmationEvent.objects.filter(confirmation__agent=agent, kind="approved").values_list(
            "confirmation_id", flat=True
        )
    )
    executions = Counter(
        dict(
            ConfirmationEvent.objects.filter(
                confirmation__agent=agent, kind__in=["executed", "failed"]
            )
            .values("confirmation_id")
            .annotate(n=Count("id"))
            .values_list("confirmation_id", "n")
        )
    )
    not_executed = {
        pk: status
        for pk, status in Confirmation.objects.filter(pk__in=approved).values_list("pk", "status")
        # A refund the order no longer allows (refunded meanwhile) fails, once: it ran.
        if status not in {ConfirmationStatus.EXECUTED, ConfirmationStatus.FAILED}
    }
    ledger = ledger_doubles(orders, {})
    records = AuditRecord.objects.filter(agent=agent).count()
    figures(
        soak_seconds=round(soak_seconds, 1),
        simulate_runs=runs,
        calls=calls,
        audit_records=records,
        refunds=Refund.objects.filter(order__in=orders).count(),
        decisions=dict(reviewer.decided),
        confirmations=dict(statuses),
        approved=len(approved),
        executed_twice=sum(n > 1 for n in executions.values()),
        approved_not_executed=len(not_executed),
        settled_seconds_after_soak=round(settled_seconds, 1),
        ledger_mismatches=ledger["ledger_mismatches"],
    )
    assert calls > 0 and reviewer.decided["approve votes"] > 0
    assert ledger["ledger_mismatches"] == {}
    assert records == calls
    assert not (statuses.keys() & STUCK)
    assert not_executed == {}
    assert all(n == 1 for n in executions.values())
    assert set(executions) == approved
    assert Order.objects.filter(refunded_cents__gt=30_000).count() == 0

"""Agent hosts' Idempotency-Keys are kept their hours and no longer, a run that lost its key
commits nothing, and an unfinished key is run again by one request at a time, in its first
request's session. (What a host sees of the header is in apis/test_allowance.py and
apis/test_unfinished_keys.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from pytest_django import Settings

from dispatch.errors import IdempotencyKeyInProgress
from dispatch.host_keys import (
    PRUNE_EVERY,
    TAKE_OVER_AFTER,
    Answer,
    Claim,
    host_key_answer,
    host_key_claim,
    host_key_release,
    request_hash,
)
from dispatch.models import Agent, AuditRecord, HostIdempotencyKey
from dispatch.services import call_dispatch
from tests.conftest import Ledger, Run

pytestmark = pytest.mark.usefixtures("orders")

ROOT = Path(__file__).resolve().parent.parent.parent
REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def answered_key(agent: Agent, key: str, hours_ago: float) -> HostIdempotencyKey:
    at = timezone.now() - timedelta(hours=hours_ago)
    return HostIdempotencyKey.objects.create(
        agent=agent,
        key=key,
        request_hash="0" * 64,
        status_code=200,
        response_body="{}",
        created_at=at,
        claimed_at=at,
        completed_at=at,
    )


def kept_keys() -> set[str]:
    return set(HostIdempotencyKey.objects.values_list("key", flat=True))


def test_the_prune_command_deletes_keys_past_their_hours(
    agent: tuple[Agent, str], run: Run, settings: Settings
) -> None:
    settings.TOOLGATE_IDEMPOTENCY_KEY_HOURS = 24
    for key, hours_ago in (
        ("fresh", 1),
        ("a-day-less-a-minute", 23.98),
        ("old", 25),
        ("older", 400),
    ):
        answered_key(agent[0], key, hours_ago)

    output = run("prune_idempotency_keys")

    assert "Deleted 2 idempotency key(s); 2 kept (24 hours)." in output
    assert kept_keys() == {"fresh", "a-day-less-a-minute"}


def test_a_longer_retention_keeps_older_keys(
    agent: tuple[Agent, str], run: Run, settings: Settings
) -> None:
    settings.TOOLGATE_IDEMPOTENCY_KEY_HOURS = 72
    for key, hours_ago in (("two-days", 48), ("four-days", 96)):
        answered_key(agent[0], key, hours_ago)

    run("prune_idempotency_keys")

    assert kept_keys() == {"two-days"}


def test_a_key_within_its_hours_still_gets_its_first_answer(agent: tuple[Agent, str]) -> None:
    answered_key(agent[0], "k", hours_ago=23.9)

    answer = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="s-1")

    assert not isinstance(answer, Claim)
    assert (answer.status_code, answer.body) == (200, b"{}")


def test_new_keys_prune_expired_ones_as_they_go(agent: tuple[Agent, str]) -> None:
    for n in range(3):
        answered_key(agent[0], f"old-{n}", hours_ago=25)

    claims = [
        host_key_claim(agent=agent[0], key=f"new-{n}", request_hash="0" * 64, session_id="s-1")
        for n in range(PRUNE_EVERY)
    ]

    assert all(isinstance(claim, Claim) for claim in claims)
    assert kept_keys() == {f"new-{n}" for n in range(PRUNE_EVERY)}


def test_a_run_whose_key_was_taken_over_commits_nothing(
    agent: tuple[Agent, str], ledger: Ledger
) -> None:
    same = request_hash(customer_id="CUS-1", tool="refund_order", arguments=REFUND)
    slow = host_key_claim(
        agent=agent[0],
        key="k",
        request_hash=same,
        session_id="s-1",
        now=timezone.now() - TAKE_OVER_AFTER - timedelta(seconds=1),
    )
    taker = host_key_claim(agent=agent[0], key="k", request_hash=same, session_id="s-2")
    assert isinstance(slow, Claim) and isinstance(taker, Claim)

    with pytest.raises(IdempotencyKeyInProgress):
        call_dispatch(
            agent=agent[0],
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=REFUND,
            on_result=lambda _: host_key_answer(claim=slow, status_code=200, body=b"{}"),
        )

    assert ledger.state() == (0, 0)
    assert AuditRecord.objects.count() == 0
    row = HostIdempotencyKey.objects.get()
    assert (row.claimed_at, row.completed_at) == (taker.claimed_at, None)


def unfinished_key(agent: Agent, key: str, session_id: str) -> HostIdempotencyKey:
    """A key whose run answered an unknown outcome, which is not final."""
    at = timezone.now() - timedelta(seconds=2)
    return HostIdempotencyKey.objects.create(
        agent=agent,
        key=key,
        request_hash="0" * 64,
        session_id=session_id,
        unfinished=True,
        status_code=200,
        response_body='{"code": "UPSTREAM_UNAVAILABLE", "data": {"outcome": "unknown"}}',
        created_at=at,
        claimed_at=at,
    )


def test_of_two_resends_of_an_unfinished_key_one_runs_in_its_session_and_one_waits(
    agent: tuple[Agent, str],
) -> None:
    unfinished_key(agent[0], "k", session_id="before-restart")

    first = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="after-1")
    with pytest.raises(IdempotencyKeyInProgress):
        host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="after-2")

    assert isinstance(first, Claim)
    assert (first.session_id, first.resumed) == ("before-restart", True)
    row = HostIdempotencyKey.objects.get()
    assert (row.unfinished, row.claimed_at, row.session_id) == (
        False,
        first.claimed_at,
        "before-restart",
    )


def test_a_resend_that_fails_leaves_the_key_unfinished_in_its_first_session(
    agent: tuple[Agent, str],
) -> None:
    unfinished_key(agent[0], "k", session_id="before-restart")
    failed = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="after-1")
    assert isinstance(failed, Claim)

    host_key_release(claim=failed)
    again = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="after-2")

    assert isinstance(again, Claim)
    assert (again.session_id, again.resumed) == ("before-restart", True)
    assert HostIdempotencyKey.objects.get().session_id == "before-restart"


def test_a_final_answer_ends_an_unfinished_key(agent: tuple[Agent, str]) -> None:
    unfinished_key(agent[0], "k", session_id="before-restart")
    resumed = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="after")
    assert isinstance(resumed, Claim)

    host_key_answer(claim=resumed, status_code=200, body=b'{"code": "OK"}')
    answer = host_key_claim(agent=agent[0], key="k", request_hash="0" * 64, session_id="later")

    assert answer == Answer(200, b'{"code": "OK"}')
    row = HostIdempotencyKey.objects.get()
    assert (row.unfinished, row.completed_at is not None) == (False, True)


def test_the_settings_refuse_to_keep_keys_less_than_a_day() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.test",
        "TOOLGATE_IDEMPOTENCY_KEY_HOURS": "12",
    }

    completed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode != 0
    assert "TOOLGATE_IDEMPOTENCY_KEY_HOURS must be at least 24" in completed.stderr

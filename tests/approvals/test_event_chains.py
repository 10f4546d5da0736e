"""Each confirmation's event log is a chain, its head on the confirmation; `verify_audit` names
an event the database's owner changed or deleted."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from pytest_django import Settings

from approvals.models import ConfirmationEvent
from approvals.services import confirmation_approve, confirmation_reject
from dispatch.audit import audit_seal
from dispatch.models import Confirmation
from tests.approvals.conftest import HeldRefund, WebhookReceiver

Capture = Callable[..., Any]


def verify(*arguments: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("verify_audit", *arguments, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue()
    return 0, out.getvalue()


def owner_runs(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The owner may set aside any trigger that keeps the log append-only.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE approvals_confirmationevent DISABLE TRIGGER USER")
        cursor.execute(statement, params)
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE approvals_confirmationevent ENABLE TRIGGER USER")


def executed(
    held_refund: HeldRefund, reviewers: list[User], capture: Capture
) -> tuple[Confirmation, list[ConfirmationEvent]]:
    held = held_refund()
    with capture(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
    held.refresh_from_db()
    return held, list(ConfirmationEvent.objects.filter(confirmation=held).order_by("chain_seq"))


def test_each_event_is_the_next_link_and_a_clean_log_verifies(
    held_refund: HeldRefund,
    reviewers: list[User],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held, events = executed(held_refund, reviewers, django_capture_on_commit_callbacks)
    rejected = held_refund(7_000, session="s-2")
    confirmation_reject(confirmation_id=rejected.pk, reviewer=reviewers[1], reason="not ours")
    rejected.refresh_from_db()

    assert [(event.kind, event.chain_seq) for event in events] == [
        ("voted", 1),
        ("approved", 2),
        ("executing", 3),
        ("executed", 4),
    ]
    assert (held.event_seq, held.event_head) == (4, events[-1].chain_hash)
    assert rejected.event_seq == 1
    code, out = verify()
    assert code == 0, out
    assert "confirmation events: 5 walked" in out


def test_it_names_the_event_whose_field_the_owner_changed(
    held_refund: HeldRefund,
    reviewers: list[User],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held, events = executed(held_refund, reviewers, django_capture_on_commit_callbacks)
    owner_runs(
        "UPDATE approvals_confirmationevent SET actor_label = 'bruno' WHERE id = %s",
        [events[1].pk],
    )

    code, out = verify()

    assert code == 1
    assert (
        f"ALTERED events:{held.pk} seq 2 (record {events[1].pk}): its fields or hash do not "
        "match its chain" in out
    )


def test_the_last_event_deleted_is_found_by_the_head_and_by_the_seal(
    held_refund: HeldRefund,
    reviewers: list[User],
    settings: Settings,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = [f"file:{seals}"]
    held, events = executed(held_refund, reviewers, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        audit_seal()
    owner_runs("DELETE FROM approvals_confirmationevent WHERE id = %s", [events[-1].pk])

    by_head, out = verify()
    assert by_head == 1
    assert f"REMOVED events:{held.pk} seq 4 (no record): the chain ends at seq 3" in out

    Confirmation.objects.filter(pk=held.pk).update(event_seq=3, event_head=events[2].chain_hash)
    alone, _ = verify()
    by_seal, out = verify("--seals", str(seals))

    assert alone == 0
    assert by_seal == 1
    assert f"REMOVED events:{held.pk} seq 4 (no record): sealed at seq 4" in out


def test_a_seal_is_posted_signed_and_a_failing_sink_leaves_the_others(
    held_refund: HeldRefund,
    reviewers: list[User],
    settings: Settings,
    tmp_path: Path,
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    webhook_receiver.answers.append(500)
    settings.TOOLGATE_AUDIT_SEAL_WEBHOOK_SECRET = "seal-secret"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = [webhook_receiver.url, f"file:{seals}"]
    held, _ = executed(held_refund, reviewers, django_capture_on_commit_callbacks)

    with django_capture_on_commit_callbacks(execute=True):
        failed = audit_seal()
    with django_capture_on_commit_callbacks(execute=True):
        sent = audit_seal()

    first, second = webhook_receiver.wait_for(2)
    assert [json.loads(line)["seal"] for line in seals.read_text().splitlines()] == [1, 2]
    assert json.loads(first.body)["hash"] == failed.hash
    body = json.loads(second.body)
    assert body["hash"] == sent.hash
    assert [f"events:{held.pk}", 4, held.event_head] in body["heads"]
    stamp = second.headers["Toolgate-Signature"].split(",")[0].removeprefix("t=")
    digest = hmac.new(b"seal-secret", f"{stamp}.".encode() + second.body, hashlib.sha256)
    assert second.headers["Toolgate-Signature"] == f"t={stamp},v1={digest.hexdigest()}"

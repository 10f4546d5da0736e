"""Events of a confirmation reach its agent's webhook, signed as docs/webhooks.md says, and every
attempt is recorded. The receiver is a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from pytest_django.fixtures import Settings

from approvals.models import WebhookDelivery, WebhookDeliveryStatus
from approvals.services import confirmation_approve
from approvals.webhooks import (
    webhook_deliver,
    webhook_enqueue,
    webhook_retry_delay,
    webhooks_resend,
    webhooks_resend_due,
)
from dispatch.models import Agent, Confirmation
from dispatch.selectors import confirmation_state
from dispatch.webhooks import agent_webhook_set
from tests.approvals.conftest import Verify, WebhookReceiver, refund_held_for
from tests.conftest import MakeAgent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("orders")]


@pytest.fixture
def local_webhooks(settings: Settings) -> Settings:
    # The receiver listens on plain http on the loopback: allowed only under these two settings.
    settings.DEBUG = True
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = True
    return settings


@pytest.fixture
def hooked(
    make_agent: MakeAgent, webhook_receiver: WebhookReceiver, local_webhooks: Settings
) -> tuple[Agent, str]:
    """An agent whose webhook is the receiver; returns it and its secret."""
    agent, _ = make_agent()
    secret = agent_webhook_set(agent=agent, url=webhook_receiver.url)
    assert secret is not None
    return agent, secret


def enqueue_and_commit(
    capture: Any, confirmation: Confirmation, event: str
) -> WebhookDelivery | None:
    with capture(execute=True), transaction.atomic():
        webhook_enqueue(confirmation=confirmation, event=event)
    return WebhookDelivery.objects.filter(confirmation=confirmation, event=event).first()


def test_an_event_reaches_the_webhook_signed_as_documented(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    documented_verify: Verify,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, secret = hooked
    confirmation = refund_held_for(agent)

    delivery = enqueue_and_commit(django_capture_on_commit_callbacks, confirmation, "rejected")

    [request] = webhook_receiver.received
    signature = request.headers["Toolgate-Signature"]
    assert documented_verify(secret, signature, request.headers["Toolgate-Delivery"], request.body)
    assert delivery is not None
    assert json.loads(request.body) == {
        "delivery_id": str(delivery.pk),
        "event": "rejected",
        "confirmation": confirmation_state(confirmation),
    }
    assert request.path == "/toolgate/events"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Toolgate-Event"] == "rejected"
    assert delivery is not None
    assert request.headers["Toolgate-Delivery"] == str(delivery.pk)
    assert delivery.status == WebhookDeliveryStatus.DELIVERED
    assert (delivery.attempts, delivery.last_status_code, delivery.last_error) == (1, 200, "")
    assert delivery.delivered_at is not None
    assert delivery.url == webhook_receiver.url


def test_the_documented_check_refuses_a_wrong_secret_a_changed_body_and_an_old_timestamp(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    documented_verify: Verify,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, secret = hooked
    enqueue_and_commit(django_capture_on_commit_callbacks, refund_held_for(agent), "expired")
    [request] = webhook_receiver.received
    signature = request.headers["Toolgate-Signature"]
    delivery_id = request.headers["Toolgate-Delivery"]
    stamp = int(re.search(r"t=(\d+)", signature).group(1))  # type: ignore[union-attr]
    v1_only = re.sub(r",v2=[0-9a-f]+", "", signature)

    checks = {
        "as sent": documented_verify(secret, signature, delivery_id, request.body),
        "another secret": documented_verify(secret + "x", signature, delivery_id, request.body),
        "changed body": documented_verify(
            secret, signature, delivery_id, request.body.replace(b"6000", b"9")
        ),
        "older than the window": documented_verify(
            secret, signature, delivery_id, request.body, window=int(time.time()) - stamp - 1
        ),
        "no signature": documented_verify(secret, "t=,v1=,v2=", delivery_id, request.body),
        "v1 alone": documented_verify(secret, v1_only, delivery_id, request.body),
    }

    assert checks == {
        "as sent": True,
        "another secret": False,
        "changed body": False,
        "older than the window": False,
        "no signature": False,
        "v1 alone": False,
    }


def test_a_replay_under_a_fresh_delivery_id_fails_v2_within_the_window(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    documented_verify: Verify,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, secret = hooked
    confirmation = refund_held_for(agent)
    enqueue_and_commit(django_capture_on_commit_callbacks, confirmation, "approved")
    enqueue_and_commit(django_capture_on_commit_callbacks, confirmation, "executed")
    captured, other = webhook_receiver.received
    signature = captured.headers["Toolgate-Signature"]
    # A fresh id a receiver has not seen: another delivery's, and one never issued.
    fresh_ids = [other.headers["Toolgate-Delivery"], "999999"]

    as_sent = documented_verify(
        secret, signature, captured.headers["Toolgate-Delivery"], captured.body
    )
    replays = [documented_verify(secret, signature, fresh, captured.body) for fresh in fresh_ids]

    assert as_sent is True
    assert replays == [False, False]
    assert json.loads(captured.body)["delivery_id"] == captured.headers["Toolgate-Delivery"]


def _v1_signature_valid(secret: str, header: str, body: bytes, window: int = 300) -> bool:
    # What docs/webhooks.md showed receivers before v2: they must keep working.
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if not fields.get("t", "").isdigit() or "v1" not in fields:
        return False
    signed = fields["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(fields["t"])) <= window
    return fresh and hmac.compare_digest(expected, fields["v1"])


def test_a_receiver_checking_v1_keeps_working_and_finds_the_id_under_it(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, secret = hooked
    delivery = enqueue_and_commit(
        django_capture_on_commit_callbacks, refund_held_for(agent), "expired"
    )
    [request] = webhook_receiver.received
    assert delivery is not None
    signature = request.headers["Toolgate-Signature"]

    valid = _v1_signature_valid(secret, signature, request.body)
    tampered_id = request.body.replace(
        f'"delivery_id":"{delivery.pk}"'.encode(), b'"delivery_id":"999999"'
    )

    assert valid is True
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64},v2=[0-9a-f]{64}", signature)
    assert tampered_id != request.body
    assert _v1_signature_valid(secret, signature, tampered_id) is False


def test_an_agent_without_a_webhook_gets_no_delivery(
    make_agent: MakeAgent, django_capture_on_commit_callbacks: Any
) -> None:
    agent, _ = make_agent()

    delivery = enqueue_and_commit(
        django_capture_on_commit_callbacks, refund_held_for(agent), "expired"
    )

    assert delivery is None
    assert not WebhookDelivery.objects.exists()


def test_nothing_is_recorded_or_sent_when_the_decision_rolls_back(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    confirmation = refund_held_for(hooked[0])

    with (
        pytest.raises(RuntimeError),
        django_capture_on_commit_callbacks(execute=True),
        transaction.atomic(),
    ):
        webhook_enqueue(confirmation=confirmation, event="approved")
        raise RuntimeError("the decision failed")

    assert not WebhookDelivery.objects.exists()
    assert webhook_receiver.received == []


def test_an_unknown_event_is_refused(hooked: tuple[Agent, str]) -> None:
    confirmation = refund_held_for(hooked[0])

    with pytest.raises(ValueError, match="not a webhook event"):
        webhook_enqueue(confirmation=confirmation, event="voted")

    assert not WebhookDelivery.objects.exists()


def test_a_failed_attempt_is_recorded_and_the_next_sends_the_same_event_again(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.answers.extend([500])
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="executed")
    delivery_id = WebhookDelivery.objects.get().pk

    first = webhook_deliver(delivery_id=delivery_id)
    second = webhook_deliver(delivery_id=delivery_id)
    third = webhook_deliver(delivery_id=delivery_id)

    assert first is not None and second is not None and third is not None
    assert (first.status, first.attempts, first.last_status_code) == ("pending", 1, 500)
    assert first.last_error == "The receiver answered HTTP 500."
    assert (second.status, second.attempts, second.last_status_code) == ("delivered", 2, 200)
    assert (third.status, third.attempts) == ("delivered", 2)
    one, two = webhook_receiver.received
    assert one.body == two.body
    assert one.headers["Toolgate-Delivery"] == two.headers["Toolgate-Delivery"]


def test_it_gives_up_after_the_last_attempt(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver, settings: Settings
) -> None:
    settings.TOOLGATE_WEBHOOK_MAX_ATTEMPTS = 2
    webhook_receiver.answers.extend([503, 503, 503])
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="unknown")
    delivery_id = WebhookDelivery.objects.get().pk

    webhook_deliver(delivery_id=delivery_id)
    last = webhook_deliver(delivery_id=delivery_id)
    after = webhook_deliver(delivery_id=delivery_id)

    assert last is not None and after is not None
    assert (last.status, last.attempts, last.last_status_code) == ("failed", 2, 503)
    assert (after.status, after.attempts) == ("failed", 2)
    assert len(webhook_receiver.received) == 2


def test_in_process_a_failing_webhook_is_tried_once_and_never_breaks_the_decision(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    webhook_receiver.answers.extend([500, 500])

    delivery = enqueue_and_commit(
        django_capture_on_commit_callbacks, refund_held_for(hooked[0]), "approved"
    )

    assert delivery is not None
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("failed", 1, 500)
    assert len(webhook_receiver.received) == 1


def test_a_redirect_is_not_followed(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.answers.extend([302])
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="executed")

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    assert delivery is not None
    assert (delivery.status, delivery.last_status_code) == ("pending", 302)
    assert len(webhook_receiver.received) == 1


def test_a_receiver_that_does_not_answer_in_time_is_a_failed_attempt(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver, settings: Settings
) -> None:
    settings.TOOLGATE_WEBHOOK_TIMEOUT_SECONDS = 0.2
    webhook_receiver.delay = 1.0
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="executed")

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    assert delivery is not None
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert "ReadTimeoutError" in delivery.last_error


def test_a_receiver_that_is_down_is_a_failed_attempt(
    make_agent: MakeAgent, local_webhooks: Settings
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    agent, _ = make_agent()
    agent_webhook_set(agent=agent, url=f"http://127.0.0.1:{closed_port}/hook")
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(agent), event="executed")

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    assert delivery is not None
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert "Connection refused" in delivery.last_error


def test_an_address_no_longer_allowed_when_sending_gets_nothing(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver, settings: Settings
) -> None:
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="executed")
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = False

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    assert delivery is not None
    assert delivery.status == WebhookDeliveryStatus.PENDING
    assert "not a public address" in delivery.last_error
    assert webhook_receiver.received == []


@pytest.mark.parametrize(
    "rebound", ["::127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::"]
)
def test_a_name_that_comes_to_resolve_to_an_ipv4_address_inside_ipv6_gets_nothing(
    rebound: str, make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolves_to = ["93.184.215.14"]

    # DNS is not ours: the name resolves to a public address when the URL is set, and to the
    # rebound one by the time of sending.
    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        assert host == "hooks.example.com"
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0)) for a in resolves_to]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    agent, _ = make_agent()
    agent_webhook_set(agent=agent, url="https://hooks.example.com/toolgate/events")
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(agent), event="executed")
    resolves_to[:] = [rebound]
    connections: list[Any] = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: connections.append(a))

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    assert delivery is not None
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert f"resolves to {ipaddress.ip_address(rebound)} (carrying " in delivery.last_error
    assert "which is not a public address" in delivery.last_error
    assert connections == []


def test_the_wait_between_attempts_doubles_up_to_the_cap(settings: Settings) -> None:
    settings.TOOLGATE_WEBHOOK_RETRY_BASE_SECONDS = 10
    settings.TOOLGATE_WEBHOOK_RETRY_MAX_SECONDS = 600

    waits = [webhook_retry_delay(attempts) for attempts in range(1, 9)]

    assert waits == [10, 20, 40, 80, 160, 320, 600, 600]


def test_resending_delivers_the_pending_and_with_failed_the_failed_too(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    settings: Settings,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.TOOLGATE_WEBHOOK_MAX_ATTEMPTS = 1
    webhook_receiver.answers.extend([500])
    confirmation = refund_held_for(hooked[0])
    with transaction.atomic():
        webhook_enqueue(confirmation=confirmation, event="approved")
        webhook_enqueue(confirmation=confirmation, event="executed")
    approved = WebhookDelivery.objects.get(event="approved")
    webhook_deliver(delivery_id=approved.pk)
    settings.TOOLGATE_WEBHOOK_MAX_ATTEMPTS = 8

    with django_capture_on_commit_callbacks(execute=True):
        pending_only = webhooks_resend()
    with django_capture_on_commit_callbacks(execute=True):
        with_failed = webhooks_resend(include_failed=True)

    assert (pending_only, with_failed) == (1, 1)
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert [request.headers["Toolgate-Event"] for request in webhook_receiver.received] == [
        "approved",
        "executed",
        "approved",
    ]


def test_deliveries_are_listed_read_only_in_the_admin(
    hooked: tuple[Agent, str], admin_client: Any
) -> None:
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(hooked[0]), event="expired")
    delivery = WebhookDelivery.objects.get()

    listing = admin_client.get("/admin/approvals/webhookdelivery/?status__exact=pending")
    change = admin_client.post(f"/admin/approvals/webhookdelivery/{delivery.pk}/change/", {})

    assert listing.status_code == 200
    assert delivery.confirmation_id.encode() in listing.content
    assert change.status_code == 403
    assert WebhookDelivery.objects.get().status == WebhookDeliveryStatus.PENDING


def test_a_pending_delivery_goes_to_the_webhook_url_the_agent_has_now(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver, documented_verify: Verify
) -> None:
    agent, secret = hooked
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(agent), event="executed")
    moved = webhook_receiver.url.replace("/toolgate/events", "/v2/events")
    agent_webhook_set(agent=agent, url=moved)

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)

    [request] = webhook_receiver.received
    assert request.path == "/v2/events"
    headers = request.headers
    assert documented_verify(
        secret, headers["Toolgate-Signature"], headers["Toolgate-Delivery"], request.body
    )
    assert delivery is not None
    assert (delivery.status, delivery.url) == ("delivered", moved)


def test_a_pending_delivery_of_an_agent_whose_webhook_was_removed_sends_nothing(
    hooked: tuple[Agent, str], webhook_receiver: WebhookReceiver
) -> None:
    agent, _ = hooked
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(agent), event="executed")
    agent_webhook_set(agent=agent, url="")

    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk, last_attempt=True)

    assert delivery is not None
    assert (delivery.status, delivery.last_error) == (
        "failed",
        "The agent has no webhook any more.",
    )
    assert webhook_receiver.received == []


def test_a_decision_and_its_execution_reach_the_agents_webhook(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    documented_verify: Verify,
    django_capture_on_commit_callbacks: Any,
) -> None:

    agent, secret = hooked
    confirmation = refund_held_for(agent)
    reviewer = User.objects.create_user("ana")

    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=confirmation.pk, reviewer=reviewer)

    events = [request.headers["Toolgate-Event"] for request in webhook_receiver.received]
    assert events == ["approved", "executed"]
    assert all(
        documented_verify(
            secret,
            request.headers["Toolgate-Signature"],
            request.headers["Toolgate-Delivery"],
            request.body,
        )
        for request in webhook_receiver.received
    )
    executed = json.loads(webhook_receiver.received[-1].body)["confirmation"]
    assert executed["status"] == "executed"
    assert executed["result"]["ok"] is True


def test_the_sweep_sends_again_a_delivery_whose_task_was_lost(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, _ = hooked
    confirmation = refund_held_for(agent)
    # Its task never left: the broker was away when the decision committed.
    with django_capture_on_commit_callbacks(execute=False), transaction.atomic():
        webhook_enqueue(confirmation=confirmation, event="rejected")
    delivery = WebhookDelivery.objects.get()

    soon = webhooks_resend_due(now=delivery.created_at + timedelta(seconds=10))
    later = webhooks_resend_due(now=delivery.created_at + timedelta(minutes=2))

    assert (soon, later) == (0, 1)
    assert len(webhook_receiver.received) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.next_attempt_at) == (WebhookDeliveryStatus.DELIVERED, None)


def test_the_sweep_leaves_a_delivery_waiting_for_its_retry_to_its_own_chain(
    hooked: tuple[Agent, str],
    webhook_receiver: WebhookReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    agent, _ = hooked
    confirmation = refund_held_for(agent)
    webhook_receiver.answers.append(503)
    with django_capture_on_commit_callbacks(execute=False), transaction.atomic():
        webhook_enqueue(confirmation=confirmation, event="rejected")
    # The worker's first attempt fails; its task will retry after the backoff.
    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery is not None and delivery.status == WebhookDeliveryStatus.PENDING
    assert delivery.next_attempt_at is not None and delivery.last_attempt_at is not None
    retry_due = delivery.next_attempt_at

    while_waiting = webhooks_resend_due(now=retry_due)

    assert retry_due > delivery.last_attempt_at
    assert while_waiting == 0
    assert len(webhook_receiver.received) == 1

"""Decisions and final results of a confirmation, POSTed to its agent's webhook.

The services call `webhook_enqueue` inside the transaction that changes the confirmation: the
delivery row commits with the change, and its task is sent only once it has. The task makes one
attempt and, while attempts are left, sends itself again later (exponential backoff); every
attempt is recorded on the row. Delivery is at least once: a worker killed after sending sends
again, with the same Toolgate-Delivery id, which receivers use to drop duplicates.

Each request is signed: `Toolgate-Signature: t=<unix time>,v1=<hex>,v2=<hex>`, HMAC-SHA256 with
the agent's webhook secret of f"{t}.{body}" (v1) and of f"{t}.{delivery id}.{body}" (v2). v1 leaves
the Toolgate-Delivery header outside what is signed, so a captured request sent again with a fresh
id passed a receiver's de-duplication within the timestamp window; v2 signs the id, which is also
in the body. v1 stays beside it so that receivers checking it keep working while they move to v2.
docs/webhooks.md shows how to check v2.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

import urllib3
from celery import Task, shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.models import WebhookDelivery, WebhookDeliveryStatus
from approvals.outbox import outbox_resend
from dispatch.models import Agent, Confirmation
from dispatch.selectors import confirmation_state
from dispatch.webhooks import WebhookTarget, WebhookUrlInvalid, webhook_target

logger = logging.getLogger(__name__)

# What a webhook is told: the decisions and the final results of a confirmation.
WEBHOOK_EVENTS = frozenset(
    {
        "approved",
        "rejected",
        "expired",
        "invalidated",
        "withdrawn",
        "superseded",
        "executed",
        "failed",
        "unknown",
    }
)

SIGNATURE_HEADER = "Toolgate-Signature"
USER_AGENT = "Toolgate-Webhooks/1"

_ERROR_LENGTH = WebhookDelivery._meta.get_field("last_error").max_length or 500


def webhook_signature(*, secret: str, timestamp: int, delivery_id: str, body: bytes) -> str:
    """The Toolgate-Signature header's value for this delivery's body sent at this time."""
    v1 = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    v2 = hmac.new(secret.encode(), f"{timestamp}.{delivery_id}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={v1.hexdigest()},v2={v2.hexdigest()}"


def webhook_body(delivery: WebhookDelivery) -> bytes:
    # The delivery's id first, then the event as recorded: a receiver that only checks v1 still
    # finds the id under a signature, in the body.
    payload = {"delivery_id": str(delivery.pk), **delivery.payload}
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def webhook_retry_delay(attempts: int) -> float:
    """Seconds to wait after the given number of failed attempts: doubling, capped."""
    base = float(settings.TOOLGATE_WEBHOOK_RETRY_BASE_SECONDS)
    cap = float(settings.TOOLGATE_WEBHOOK_RETRY_MAX_SECONDS)
    return min(cap, base * 2.0 ** max(0, attempts - 1))


def webhook_enqueue(*, confirmation: Confirmation, event: str) -> None:
    """Record that the confirmation's agent is to be told of this event, and send it once the
    caller's transaction commits. Nothing happens for an agent without a webhook.

    Call it after the confirmation changed, in the same transaction: the body is its state then,
    as GET /api/v1/confirmations/{id} answers it.
    """
    if event not in WEBHOOK_EVENTS:
        raise ValueError(f"not a webhook event: {event!r}")
    now = timezone.now()
    url = Agent.objects.filter(pk=confirmation.agent_id).values_list("webhook_url", flat=True)
    webhook_url = url.first()
    if not webhook_url:
        return
    delivery = WebhookDelivery.objects.create(
        confirmation=confirmation,
        event=event,
        url=webhook_url,
        payload={"event": event, "confirmation": confirmation_state(confirmation)},
        created_at=now,
        next_attempt_at=now,
    )
    # Robust: a broker that is away must not undo or fail the decision that already committed;
    # the delivery stays pending, and the sweep (webhooks_resend_due) sends it again.
    _send_after_commit(delivery.pk)


def _send_after_commit(delivery_id: int) -> None:
    def send_delivery() -> None:
        webhook_deliver_task.delay(delivery_id)

    # A named function, not a partial: Django words a robust callback's failure by its
    # __qualname__, which a partial lacks (the failure would then escape after all).
    transaction.on_commit(send_delivery, robust=True)


def _host_header(target: WebhookTarget) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default_port = 443 if target.scheme == "https" else 80
    return host if target.port == default_port else f"{host}:{target.port}"


def _post(target: WebhookTarget, body: bytes, headers: dict[str, str]) -> int:
    """POST to the address that was checked (not to what the name resolves to by now); no
    redirects, which could lead anywhere. Returns the HTTP status."""
    seconds = float(settings.TOOLGATE_WEBHOOK_TIMEOUT_SECONDS)
    options: dict[str, Any] = {
        "timeout": urllib3.Timeout(connect=seconds, read=seconds),
        "retries": False,
        "maxsize": 1,
    }
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
            **options,
        )
    else:
        pool = urllib3.HTTPConnectionPool(target.address, target.port, **options)
    with pool:
        response = pool.urlopen(
            "POST",
            target.target,
            body=body,
            headers={**headers, "Host": _host_header(target)},
            redirect=False,
            preload_content=False,
        )
        try:
            # What the receiver answers is not kept; reading a little lets it finish cleanly.
            response.read(1024)
        finally:
            response.release_conn()
        return int(response.status)


def _attempt(delivery: WebhookDelivery, url: str, secret: str) -> tuple[int | None, str]:
    """One request; (HTTP status or None, error or "")."""
    if not url or not secret:
        return None, "The agent has no webhook any more."
    try:
        target = webhook_target(url)
    except WebhookUrlInvalid as exc:
        return None, str(exc)
    body = webhook_body(delivery)
    delivery_id = str(delivery.pk)
    signature = webhook_signature(
        secret=secret, timestamp=int(time.time()), delivery_id=delivery_id, body=body
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Toolgate-Event": delivery.event,
        "Toolgate-Delivery": delivery_id,
        SIGNATURE_HEADER: signature,
    }
    try:
        status_code = _post(target, body, headers)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if 200 <= status_code < 300:
        return status_code, ""
    return status_code, f"The receiver answered HTTP {status_code}."


def webhook_deliver(*, delivery_id: int, last_attempt: bool = False) -> WebhookDelivery | None:
    """Make one attempt at a pending delivery and record it; the delivery as it stands after, or
    None if there is no such delivery. Past TOOLGATE_WEBHOOK_MAX_ATTEMPTS attempts, or when told
    this is the last one, a failed attempt marks it failed."""
    delivery = (
        WebhookDelivery.objects.select_related("confirmation__agent").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.status != WebhookDeliveryStatus.PENDING:
        return delivery
    # The agent's webhook as it is now: an operator who fixed a broken URL wants what is still
    # pending to go to the fixed one.
    agent = delivery.confirmation.agent
    status_code, error = _attempt(delivery, agent.webhook_url, agent.webhook_secret)
    now = timezone.now()
    changes: dict[str, Any] = {
        "url": agent.webhook_url or delivery.url,
        "attempts": F("attempts") + 1,
        "last_attempt_at": now,
        "last_status_code": status_code,
        "last_error": error[:_ERROR_LENGTH],
    }
    if not error:
        changes.update(status=WebhookDeliveryStatus.DELIVERED, delivered_at=now)
        changes.update(next_attempt_at=None)
    elif last_attempt or delivery.attempts + 1 >= settings.TOOLGATE_WEBHOOK_MAX_ATTEMPTS:
        changes.update(status=WebhookDeliveryStatus.FAILED, next_attempt_at=None)
    else:
        # Its task retries itself then (webhook_deliver_task): in flight until that moment.
        changes.update(
            next_attempt_at=now + timedelta(seconds=webhook_retry_delay(delivery.attempts + 1))
        )
    if error:
        logger.warning(
            "Webhook delivery %s (%s of %s) attempt %s failed: %s",
            delivery.pk,
            delivery.event,
            delivery.confirmation_id,
            delivery.attempts + 1,
            error,
        )
    # Only a pending row: a twin attempt (a redelivered task) that finished first keeps its word.
    WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDeliveryStatus.PENDING).update(
        **changes
    )
    delivery.refresh_from_db()
    return delivery


@transaction.atomic
def webhooks_resend(*, include_failed: bool = False) -> int:
    """Send every pending delivery again, and with include_failed give the failed ones a new
    round of attempts; how many were sent. A pending one may still have a retry waiting in the
    broker: receivers drop the repeat by its delivery id."""
    if include_failed:
        WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.FAILED).update(
            status=WebhookDeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now()
        )
    pending = WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING)
    ids = list(pending.order_by("created_at", "id").values_list("pk", flat=True))
    for delivery_id in ids:
        _send_after_commit(delivery_id)
    return len(ids)


def webhooks_resend_due(*, now: datetime | None = None) -> int:
    """Send again the pending deliveries whose next attempt was due more than
    TOOLGATE_EXECUTION_RESEND_SECONDS ago: their task was lost (the broker was down when it was
    sent, or lost it). A delivery whose retry waits in the broker is not due yet, and is left to
    its own retry chain. How many were sent; the beat runs it, and every worker as it starts."""
    now = now or timezone.now()
    lost_before = now - timedelta(seconds=settings.TOOLGATE_EXECUTION_RESEND_SECONDS)
    lost = WebhookDelivery.objects.filter(
        status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=lost_before
    )
    return outbox_resend(lost, now=now, send=webhook_deliver_task.delay, batch=RESEND_BATCH)


# How many deliveries one sweep sends at most; the rest wait for the next round.
RESEND_BATCH = 500


@shared_task(ignore_result=True)
def webhooks_resend_task() -> int:
    return webhooks_resend_due()


@shared_task(bind=True, acks_late=True, ignore_result=True)
def webhook_deliver_task(self: Task[[int], None], delivery_id: int) -> None:
    # Run in-process (no broker), a retry would come at once and hold up the request that made
    # the decision: there, one attempt.
    eager = bool(self.request.is_eager)
    delivery = webhook_deliver(delivery_id=delivery_id, last_attempt=eager)
    if delivery is not None and delivery.status == WebhookDeliveryStatus.PENDING:
        raise self.retry(countdown=webhook_retry_delay(delivery.attempts), max_retries=None)

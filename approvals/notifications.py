"""Held calls announced to the reviewers who may decide them, by e-mail and on Slack, and
escalated when nobody decides in time.

How approvals learns of a new hold: dispatch may not import approvals, so approvals listens.
`notifications_on_hold` is connected to Django's post_save of dispatch.Confirmation (apps.py);
the store creates the confirmation with the ORM inside the hold's transaction, so the receiver's
rows commit or roll back with the hold. It writes one Notification row per configured channel in
one INSERT (nothing where no channel is configured), and sends each after commit: the held path
gains that one statement, and the agent's call never waits for SMTP or Slack.

A row is sent by its task: one attempt, recorded on the row, then the task sends itself again
later (exponential backoff) while attempts are left; past them the row is failed, which the
queue page shows to administrators. A row whose task was lost (the broker was away) is found by
the sweep (`notifications_resend_due`, beat and every worker at its start) and sent again, as
WebhookDelivery's are. Who is told is the decision core's answer (`deciders`); escalation is per
agent (NotificationRule) or by the TOOLGATE_NOTIFY_* settings.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals.deciding import reviewer_limits, reviewers_pool
from approvals.events import event_append
from approvals.models import (
    EventKind,
    Notification,
    NotificationChannel,
    NotificationRule,
    NotificationStage,
    NotificationStatus,
)
from approvals.notifying import (
    ChannelFailed,
    HeldCallMessage,
    email_send,
    held_call_message,
    slack_outcome_update,
    slack_post,
)
from approvals.outbox import outbox_resend
from approvals.selectors import ReviewItem, review_items
from approvals.slack import slack_requests_prune
from dispatch.models import Confirmation, ConfirmationStatus

logger = logging.getLogger(__name__)

_ERROR_LENGTH = Notification._meta.get_field("last_error").max_length or 500

# How many rows one sweep sends or escalates at most; the rest wait for the next round.
SWEEP_BATCH = 500


def channels_configured() -> list[str]:
    """The channels that are set up in settings: e-mail when it is switched on, Slack when it has
    a bot token (its channel, global or the agent's rule's, is found when it is sent)."""
    channels: list[str] = []
    if settings.TOOLGATE_NOTIFY_EMAIL:
        channels.append(NotificationChannel.EMAIL)
    if settings.SLACK_BOT_TOKEN:
        channels.append(NotificationChannel.SLACK)
    return channels


def notifications_on_hold(
    sender: type[Confirmation],
    instance: Confirmation,
    created: bool,
    raw: bool,
    update_fields: frozenset[str] | None = None,
    **_: Any,
) -> None:
    """post_save of a Confirmation: a new hold is announced on every configured channel, and a
    decision updates the call's Slack messages."""
    if raw:
        return
    if created:
        notifications_enqueue(confirmation=instance)
    elif update_fields and "status" in update_fields and str(instance.status) in DECIDED:
        notifications_decided(confirmation=instance)


# The moves after which a call's Slack messages no longer ask for a decision.
DECIDED = frozenset(
    {
        ConfirmationStatus.APPROVED,
        ConfirmationStatus.REJECTED,
        ConfirmationStatus.EXPIRED,
        ConfirmationStatus.INVALIDATED,
    }
)


def notifications_enqueue(*, confirmation: Confirmation) -> int:
    """Write a pending row per channel for a new hold in one INSERT, sent once the caller's
    transaction (the hold's) commits; how many."""
    channels = channels_configured()
    if not channels:
        return 0
    now = timezone.now()
    rows = Notification.objects.bulk_create(
        [
            Notification(
                confirmation=confirmation,
                stage=NotificationStage.HELD,
                channel=channel,
                created_at=now,
                next_attempt_at=now,
            )
            for channel in channels
        ]
    )
    ids = [row.pk for row in rows if row.pk is not None]
    _send_after_commit(ids)
    return len(rows)


def _send_after_commit(ids: list[int]) -> None:
    if not ids:
        return

    def send_notifications() -> None:
        # One message to the broker from the agent's request, whatever the number of channels.
        if len(ids) == 1:
            notification_send_task.delay(ids[0])
        else:
            notifications_send_task.delay(ids)

    # Robust: a broker that is away must not fail the hold that committed; the sweep sends them.
    transaction.on_commit(send_notifications, robust=True)


def notification_retry_delay(attempts: int) -> float:
    """Seconds to wait after the given number of failed attempts: doubling, capped."""
    base = float(settings.TOOLGATE_NOTIFY_RETRY_BASE_SECONDS)
    cap = float(settings.TOOLGATE_NOTIFY_RETRY_MAX_SECONDS)
    return min(cap, base * 2.0 ** max(0, attempts - 1))


# Who is told --------------------------------------------------------------------------------


def deciders(item: ReviewItem) -> list[User]:
    """The reviewers who may decide the held call now, as the decision core says: where one
    approval decides, those whose limit covers the customer's sum; where more are needed, every
    reviewer who has not approved yet (each approval counts)."""
    needs = item.approvals
    voted = {voter.username for voter in needs.voters}
    pool = [reviewer.username for reviewer in reviewers_pool(reviewer_limits())]
    if needs.needs_limit and needs.missing <= 1:
        names = [name for name in needs.covering if name not in voted]
    else:
        names = [name for name in pool if name not in voted]
    return list(User.objects.filter(username__in=names, is_active=True).order_by("username"))


def _rule(confirmation: Confirmation) -> NotificationRule | None:
    return NotificationRule.objects.filter(agent_id=confirmation.agent_id).first()


def escalation_people(rule: NotificationRule | None) -> list[User]:
    """Who an escalation tells: the rule's group and named people, or the settings' group."""
    group = rule.escalate_group if rule is not None and rule.escalate_group else ""
    group = group or settings.TOOLGATE_NOTIFY_ESCALATE_GROUP
    found = Q(groups__name=group) if group else Q(pk__in=[])
    if rule is not None:
        found |= Q(pk__in=rule.escalate_users.values("pk"))
    return list(User.objects.filter(found, is_active=True).distinct().order_by("username"))


def _recipients(
    notification: Notification, item: ReviewItem, rule: NotificationRule | None
) -> list[User]:
    if notification.stage == NotificationStage.HELD:
        return deciders(item)
    people = {user.pk: user for user in escalation_people(rule)}
    if notification.stage == NotificationStage.EXPIRING:
        people.update({user.pk: user for user in deciders(item)})
    return sorted(people.values(), key=lambda user: user.username)


def _slack_channel(rule: NotificationRule | None) -> str:
    if rule is not None and rule.slack_channel:
        return rule.slack_channel
    return str(settings.TOOLGATE_SLACK_CHANNEL)


# Sending ------------------------------------------------------------------------------------


def notification_send(*, notification_id: int, last_attempt: bool = False) -> Notification | None:
    """Make one attempt at a pending notification and record it; the row as it stands after."""
    notification = (
        Notification.objects.select_related("confirmation__agent")
        .filter(pk=notification_id)
        .first()
    )
    if notification is None or notification.status != NotificationStatus.PENDING:
        return notification
    confirmation = notification.confirmation
    now = timezone.now()
    changes: dict[str, Any] = {"last_attempt_at": now}
    if confirmation.status != ConfirmationStatus.PENDING or confirmation.expires_at <= now:
        changes.update(status=NotificationStatus.SKIPPED, next_attempt_at=None)
        changes["last_error"] = f"Not sent: it is {confirmation.status} by now."
        return _record(notification, changes)
    rule = _rule(confirmation)
    item = _item(confirmation)
    message = held_call_message(item, stage=notification.stage)
    done = list(notification.recipients_done)
    try:
        if notification.channel == NotificationChannel.EMAIL:
            if rule is not None and not rule.email:
                return _skip(notification, changes, "E-mail is off for this agent.")
            recipients = [user for user in _recipients(notification, item, rule) if user.email]
            if not recipients:
                return _skip(notification, changes, "No reviewer with an e-mail address to tell.")
            for user in recipients:
                if user.pk in done:
                    continue
                email_send(message, user=user)
                done.append(user.pk)
        else:
            channel = _slack_channel(rule)
            if not channel:
                return _skip(notification, changes, "No Slack channel for this agent.")
            ts = slack_post(message, channel=channel)
            changes.update(slack_channel=channel, slack_ts=ts)
    except ChannelFailed as exc:
        error = str(exc)
        changes.update(
            attempts=F("attempts") + 1, recipients_done=done, last_error=error[:_ERROR_LENGTH]
        )
        if last_attempt or notification.attempts + 1 >= settings.TOOLGATE_NOTIFY_MAX_ATTEMPTS:
            changes.update(status=NotificationStatus.FAILED, next_attempt_at=None)
        else:
            delay = notification_retry_delay(notification.attempts + 1)
            changes.update(next_attempt_at=now + timedelta(seconds=delay))
        logger.warning(
            "Notification %s (%s of %s by %s) attempt %s failed: %s",
            notification.pk,
            notification.stage,
            confirmation.pk,
            notification.channel,
            notification.attempts + 1,
            error,
        )
        return _record(notification, changes)
    changes.update(
        attempts=F("attempts") + 1,
        status=NotificationStatus.SENT,
        sent_at=timezone.now(),
        next_attempt_at=None,
        recipients_done=done,
        last_error="",
    )
    return _record(notification, changes)


def _skip(notification: Notification, changes: dict[str, Any], why: str) -> Notification:
    changes.update(status=NotificationStatus.SKIPPED, next_attempt_at=None, last_error=why)
    return _record(notification, changes)


def _record(notification: Notification, changes: dict[str, Any]) -> Notification:
    # Only a pending row: a twin attempt (a redelivered task) that finished first keeps its word.
    Notification.objects.filter(pk=notification.pk, status=NotificationStatus.PENDING).update(
        **changes
    )
    notification.refresh_from_db()
    return notification


def _item(confirmation: Confirmation) -> ReviewItem:
    """What the card shows of the call, for no reader in particular."""
    return review_items([confirmation], reader=None, with_events=True)[0]


def _message_of(confirmation: Confirmation) -> HeldCallMessage:
    return held_call_message(_item(confirmation), stage=NotificationStage.HELD)


def slack_messages_update(*, confirmation_id: str) -> int:
    """Every Slack message of the call says how it was decided (chat.update), so that others in
    the channel see it is no longer waiting; how many were updated."""
    confirmation = (
        Confirmation.objects.filter(pk=confirmation_id)
        .select_related("agent__current_policy")
        .first()
    )
    if confirmation is None:
        return 0
    posted = Notification.objects.filter(
        confirmation_id=confirmation_id, channel=NotificationChannel.SLACK
    ).exclude(slack_ts="")
    message = _message_of(confirmation)
    updated = 0
    for notification in posted:
        try:
            slack_outcome_update(
                message, channel=notification.slack_channel, ts=notification.slack_ts
            )
        except ChannelFailed as exc:
            logger.warning("Could not update the Slack message of %s: %s", confirmation_id, exc)
            continue
        updated += 1
    return updated


def notifications_decided(*, confirmation: Confirmation) -> None:
    """Called as a confirmation moves to a final decision, in its transaction: its Slack
    messages are updated once that commits. Nothing where Slack is not configured."""
    if not settings.SLACK_BOT_TOKEN:
        return
    confirmation_id = confirmation.pk

    def update_slack() -> None:
        slack_update_task.delay(confirmation_id)

    transaction.on_commit(update_slack, robust=True)


# The sweeps ---------------------------------------------------------------------------------


def notifications_resend_due(*, now: datetime | None = None) -> int:
    """Send again the pending rows whose attempt was due more than
    TOOLGATE_EXECUTION_RESEND_SECONDS ago: their task was lost. How many were sent."""
    now = now or timezone.now()
    lost_before = now - timedelta(seconds=settings.TOOLGATE_EXECUTION_RESEND_SECONDS)
    lost = Notification.objects.filter(
        status=NotificationStatus.PENDING, next_attempt_at__lte=lost_before
    )
    return outbox_resend(lost, now=now, send=notification_send_task.delay, batch=SWEEP_BATCH)


def _minutes(rule: NotificationRule | None, name: str, setting: str) -> int | None:
    value = getattr(rule, name, None) if rule is not None else None
    if value is None:
        value = getattr(settings, setting)
    return None if value is None else int(value)


def escalations_due(*, now: datetime | None = None) -> int:
    """Escalate the pending calls undecided after their rule's minutes, and remind before expiry
    those about to expire; each once (the stage's rows are unique), with an event in the card's
    timeline. How many stages were written."""
    now = now or timezone.now()
    pending = (
        Confirmation.objects.filter(status=ConfirmationStatus.PENDING, expires_at__gt=now)
        .select_related("agent")
        .order_by("created_at")
    )
    rules = {rule.agent_id: rule for rule in NotificationRule.objects.all()}
    done = set(
        Notification.objects.filter(
            confirmation__in=pending,
            stage__in=[NotificationStage.ESCALATED, NotificationStage.EXPIRING],
        ).values_list("confirmation_id", "stage")
    )
    written = 0
    for confirmation in pending[:SWEEP_BATCH]:
        rule = rules.get(confirmation.agent_id)
        after = _minutes(rule, "escalate_after_minutes", "TOOLGATE_NOTIFY_ESCALATE_AFTER_MINUTES")
        before = _minutes(
            rule, "remind_before_expiry_minutes", "TOOLGATE_NOTIFY_REMIND_BEFORE_EXPIRY_MINUTES"
        )
        if (
            after is not None
            and (confirmation.pk, NotificationStage.ESCALATED) not in done
            and confirmation.created_at + timedelta(minutes=after) <= now
        ):
            written += _escalate(confirmation, NotificationStage.ESCALATED, rule, now, after)
        if (
            before is not None
            and (confirmation.pk, NotificationStage.EXPIRING) not in done
            and confirmation.expires_at - timedelta(minutes=before) <= now
        ):
            written += _escalate(confirmation, NotificationStage.EXPIRING, rule, now, before)
    return written


@transaction.atomic
def _escalate(
    confirmation: Confirmation,
    stage: str,
    rule: NotificationRule | None,
    now: datetime,
    minutes: int,
) -> int:
    # Nothing to tell without a channel, and nothing once it is decided (its row locked, so a
    # decision waits for the event). The unique stage decides between two sweeps at once: the
    # one whose rows go in writes the event.
    channels = channels_configured()
    if not channels:
        return 0
    still_pending = Confirmation.objects.select_for_update().filter(
        pk=confirmation.pk, status=ConfirmationStatus.PENDING
    )
    if not still_pending.exists():
        return 0
    created = []
    for channel in channels:
        row, made = Notification.objects.get_or_create(
            confirmation=confirmation,
            stage=stage,
            channel=channel,
            defaults={"created_at": now, "next_attempt_at": now},
        )
        if made:
            created.append(row.pk)
    if not created:
        return 0
    _send_after_commit(created)
    names = ", ".join(user.username for user in escalation_people(rule))
    if stage == NotificationStage.ESCALATED:
        kind = EventKind.ESCALATED
        words = f"Undecided after {minutes} minutes: escalated to {names or 'nobody (no group)'}."
    else:
        kind = EventKind.REMINDED
        words = f"Undecided {minutes} minutes before it expires: the reviewers were told again."
    event_append(confirmation, kind, None, now, words, {"stage": stage, "channels": channels})
    return 1


@shared_task(ignore_result=True)
def notifications_sweep_task() -> int:
    slack_requests_prune()
    return notifications_resend_due() + escalations_due()


@shared_task(bind=True, acks_late=True, ignore_result=True)
def notification_send_task(self: Task[[int], None], notification_id: int) -> None:
    # In-process (no broker) a retry would come at once and hold up the request that held the
    # call: there, one attempt.
    eager = bool(self.request.is_eager)
    notification = notification_send(notification_id=notification_id, last_attempt=eager)
    if notification is not None and notification.status == NotificationStatus.PENDING:
        raise self.retry(
            countdown=notification_retry_delay(notification.attempts), max_retries=None
        )


@shared_task(acks_late=True, ignore_result=True)
def notifications_send_task(notification_ids: list[int]) -> None:
    for notification_id in notification_ids:
        notification_send_task.delay(notification_id)


@shared_task(acks_late=True, ignore_result=True)
def slack_update_task(confirmation_id: str) -> None:
    slack_messages_update(confirmation_id=confirmation_id)


def failing_channels() -> list[dict[str, Any]]:
    """The channels whose latest notifications failed, for administrators: channel, how many
    failed in the last day, and the last error."""
    since = timezone.now() - timedelta(days=1)
    found = []
    for channel in NotificationChannel:
        failed = Notification.objects.filter(
            channel=channel, status=NotificationStatus.FAILED, last_attempt_at__gte=since
        ).order_by("-last_attempt_at")
        last = failed.first()
        if last is not None:
            found.append(
                {"channel": channel.label, "failed": failed.count(), "error": last.last_error}
            )
    return found

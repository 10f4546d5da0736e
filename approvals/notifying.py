"""What a notification says, and the two channels that carry it: e-mail over SMTP (Django's
e-mail framework) and Slack's Web API (slack-sdk, Block Kit).

A message shows what the card shows: the amount as people write it, the tool's words, why it was
held, the customer's sum, the expiry and a link to the card. It never carries the agent's token,
a secret, or what the agent host sent for the reviewer (its unverified context): that is read on
the card, escaped. What does come from the call (its subject, its arguments' words) is escaped
for the channel: HTML-escaped by the e-mail's template, Slack's three control characters
escaped in mrkdwn, so that no call can mention @channel or make a link.
"""

from __future__ import annotations

import smtplib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from approvals.models import NotificationStage
from dispatch.models import ConfirmationStatus

if TYPE_CHECKING:
    from approvals.selectors import ReviewItem

MAIL_LINK_SALT = "toolgate.approvals.mail-link"

APPROVE_ACTION = "toolgate_approve"
OPEN_ACTION = "toolgate_open"


class ChannelFailed(Exception):
    """A channel could not take the message; the words say why, for the administrators."""


@dataclass(frozen=True, slots=True)
class HeldCallMessage:
    confirmation_id: str
    stage: str
    status: str
    title: str
    tool_label: str
    amount: str
    subject: str
    why: str
    customer_sum: str
    still_needed: str
    expires_at: datetime
    card_url: str
    # Who decided, once it is decided (for the Slack message's update).
    outcome: str = ""


def site_url(path: str) -> str:
    return str(settings.TOOLGATE_SITE_URL).rstrip("/") + path


def held_call_message(item: ReviewItem, *, stage: str) -> HeldCallMessage:
    confirmation = item.confirmation
    return HeldCallMessage(
        confirmation_id=confirmation.pk,
        stage=stage,
        status=item.status,
        title=item.title or item.tool_label,
        tool_label=item.tool_label,
        amount=item.amount,
        subject=item.subject,
        why=item.hold.summary if item.hold is not None else "",
        customer_sum=_customer_sum(item),
        still_needed=item.approvals.still_needed,
        expires_at=confirmation.expires_at,
        card_url=site_url(reverse("approvals:detail", args=[confirmation.pk])),
        outcome=_outcome(item),
    )


def _customer_sum(item: ReviewItem) -> str:
    # As the card says it: the sum with the customer's other money, or that there is none.
    if item.customer_sum is not None:
        return item.customer_sum.summary
    return item.standing.meaning if item.standing is not None else ""


def _outcome(item: ReviewItem) -> str:
    if item.status == ConfirmationStatus.PENDING:
        return ""
    decider = next(
        (
            event
            for event in reversed(list(item.events))
            if event.kind in ("approved", "rejected", "expired", "invalidated")
        ),
        None,
    )
    if decider is None:
        return f"It is {item.status}."
    channel = decider.data.get("channel", "") if isinstance(decider.data, dict) else ""
    by = f" by {decider.actor_label}" + (f" from {channel}" if channel else "")
    return f"{decider.kind.capitalize()}{by} at {decider.at:%Y-%m-%d %H:%M} UTC."


_HEADINGS: dict[str, str] = {
    NotificationStage.HELD: "Held for your decision",
    NotificationStage.ESCALATED: "Escalated: still undecided",
    NotificationStage.EXPIRING: "Expiring soon: still undecided",
}


def heading(stage: str) -> str:
    return _HEADINGS.get(stage, "Held call")


# E-mail -------------------------------------------------------------------------------------


def mail_link(*, confirmation_id: str, user: User, expires_at: datetime) -> str:
    """A link that opens the card for this reviewer after login, until the call expires: signed,
    bound to the reviewer and the confirmation. Opening it decides nothing."""
    token = signing.dumps(
        {"c": confirmation_id, "u": user.pk, "e": int(expires_at.timestamp())},
        salt=MAIL_LINK_SALT,
        compress=True,
    )
    return site_url(reverse("approvals:mail_link", args=[token]))


def email_send(message: HeldCallMessage, *, user: User) -> None:
    """One e-mail to one reviewer, with their own link; raises ChannelFailed."""
    context = {
        "message": message,
        "heading": heading(message.stage),
        "link": mail_link(
            confirmation_id=message.confirmation_id, user=user, expires_at=message.expires_at
        ),
        "reviewer": user,
    }
    subject = f"[Toolgate] {heading(message.stage)}: {message.title}"
    email = EmailMultiAlternatives(
        subject=" ".join(subject.split())[:200],
        body=render_to_string("approvals/notification_email.txt", context),
        to=[user.email],
    )
    email.attach_alternative(
        render_to_string("approvals/notification_email.html", context), "text/html"
    )
    try:
        email.send()
    except (smtplib.SMTPException, OSError) as exc:
        raise ChannelFailed(f"SMTP: {type(exc).__name__}: {exc}") from None


# Slack --------------------------------------------------------------------------------------


def slack_client() -> WebClient:
    return WebClient(
        token=settings.SLACK_BOT_TOKEN,
        base_url=settings.TOOLGATE_SLACK_API_URL,
        timeout=int(settings.TOOLGATE_SLACK_TIMEOUT_SECONDS),
    )


def slack_escaped(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally: its control characters escaped, as Slack
    documents (&, <, >), so that no mention, channel ping or link is made of it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_blocks(message: HeldCallMessage) -> list[dict[str, Any]]:
    """Block Kit: the heading, the facts, and Approve plus Open the card (a rejection takes a
    reason, given on the card)."""
    lines = [
        f"*{slack_escaped(heading(message.stage))}*: {slack_escaped(message.tool_label)}",
        f"*Amount:* {slack_escaped(message.amount or '-')}"
        + (f" · *For:* {slack_escaped(message.subject)}" if message.subject else ""),
    ]
    if message.why:
        lines.append(f"*Why held:* {slack_escaped(message.why)}")
    if message.customer_sum:
        lines.append(f"*Customer's sum:* {slack_escaped(message.customer_sum)}")
    if message.still_needed:
        lines.append(slack_escaped(message.still_needed))
    expires = int(message.expires_at.timestamp())
    lines.append(
        f"*Expires:* <!date^{expires}^{{date_short_pretty}} {{time}}|"
        f"{message.expires_at:%Y-%m-%d %H:%M} UTC>"
    )
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}
    ]
    if message.outcome:
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": slack_escaped(message.outcome)}],
            }
        )
        blocks.append(_open_button_block(message))
        return blocks
    blocks.append(
        {
            "type": "actions",
            "block_id": f"toolgate:{message.confirmation_id}",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE_ACTION,
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": message.confirmation_id,
                },
                _open_button(message, "Open the card (reject)"),
            ],
        }
    )
    return blocks


def _open_button(message: HeldCallMessage, text: str) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": OPEN_ACTION,
        "text": {"type": "plain_text", "text": text},
        "url": message.card_url,
        "value": message.confirmation_id,
    }


def _open_button_block(message: HeldCallMessage) -> dict[str, Any]:
    return {"type": "actions", "elements": [_open_button(message, "Open the card")]}


def slack_text(message: HeldCallMessage) -> str:
    # The notification's plain words (and what screen readers and push notices show).
    words = f"{heading(message.stage)}: {message.title}"
    return slack_escaped(f"{words}. {message.outcome}" if message.outcome else words)


def _slack_call(method: str, **arguments: Any) -> dict[str, Any]:
    try:
        response = getattr(slack_client(), method)(**arguments)
    except (SlackClientError, OSError) as exc:
        raise ChannelFailed(f"Slack {method}: {type(exc).__name__}: {exc}") from None
    data = response.data if isinstance(response.data, dict) else {}
    return data


def slack_post(message: HeldCallMessage, *, channel: str) -> str:
    """chat.postMessage; the message's ts. Raises ChannelFailed."""
    data = _slack_call(
        "chat_postMessage", channel=channel, text=slack_text(message), blocks=slack_blocks(message)
    )
    return str(data.get("ts", ""))


def slack_outcome_update(message: HeldCallMessage, *, channel: str, ts: str) -> None:
    """chat.update: the message says how it was decided, without its Approve button."""
    _slack_call(
        "chat_update",
        channel=channel,
        ts=ts,
        text=slack_text(message),
        blocks=slack_blocks(message),
    )


def slack_ephemeral(*, channel: str, slack_user_id: str, text: str) -> None:
    """chat.postEphemeral: words only that Slack user sees (why a button did not decide)."""
    _slack_call("chat_postEphemeral", channel=channel, user=slack_user_id, text=text)

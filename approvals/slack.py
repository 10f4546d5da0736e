"""Deciding from Slack: its signed requests, the link of a Slack user to a reviewer, and the
Approve button, which goes through the same decision core as the card.

A request is Slack's when it is signed as Slack documents: HMAC-SHA256 with the app's signing
secret of "v0:{timestamp}:{body}", the timestamp within five minutes, compared in constant time
(slack_sdk.signature.SignatureVerifier); a signature seen before is a replay. Each refusal is a
security event.

A Slack user decides as the reviewer they were linked to, and the link is proven from both
sides: Toolgate shows the signed-in reviewer a one-time code, and that very Slack user sends it
back (`/toolgate link CODE`) in a signed request from the configured workspace (team id). A
typed Slack id or a matching name links nobody.

A button decides only what one click may decide: an approval that would be one vote of several,
or needs a second look, a reviewer's word on a possible duplicate, or (for a rejection) a
reason, records nothing and sends the reviewer to the card.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from approvals import services
from approvals.models import SlackLink, SlackRequest
from approvals.notifying import (
    APPROVE_ACTION,
    ChannelFailed,
    site_url,
    slack_ephemeral,
)
from approvals.reviewers import is_reviewer
from dispatch.client_address import client_address
from dispatch.security import Origin, security_event_record

logger = logging.getLogger(__name__)

# Slack's own window: a request signed longer ago than this is refused.
MAX_AGE_SECONDS = 5 * 60
SLACK_CHANNEL = "slack"
ACTIONS_PATH = "/approvals/slack/actions"
COMMANDS_PATH = "/approvals/slack/commands"

# The one-time code's alphabet: no 0/O or 1/I to misread.
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8


class SlackRefused(Exception):
    """A Slack request refused: its HTTP status, a stable reason (the security event's), and
    words for whoever reads them."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def _refuse(origin: Origin, status: int, reason: str, message: str) -> SlackRefused:
    security_event_record(origin=origin, agent=None, status=status, reason=reason, detail=message)
    return SlackRefused(status, reason, message)


def slack_origin(request: HttpRequest) -> Origin:
    return Origin(SLACK_CHANNEL, str(request.method), request.path, client_address(request) or None)


def slack_request_verify(request: HttpRequest) -> None:
    """Raise SlackRefused (and record it) unless the request is signed by Slack, fresh and new."""
    origin = slack_origin(request)
    secret = settings.SLACK_SIGNING_SECRET
    if not secret:
        raise SlackRefused(404, "slack_not_configured", "Slack is not configured here.")
    timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    if not timestamp or not signature:
        raise _refuse(origin, 401, "slack_unsigned", "The request carries no Slack signature.")
    try:
        age = abs(timezone.now().timestamp() - int(timestamp))
    except ValueError:
        raise _refuse(
            origin, 401, "slack_unsigned", "The Slack timestamp is not a number."
        ) from None
    if age > MAX_AGE_SECONDS:
        raise _refuse(
            origin,
            401,
            "slack_stale",
            f"The Slack request was signed {int(age)} s ago, more than {MAX_AGE_SECONDS} s.",
        )
    if not SignatureVerifier(secret).is_valid(request.body, timestamp, signature):
        raise _refuse(origin, 401, "slack_signature_invalid", "The Slack signature does not match.")
    try:
        with transaction.atomic():
            SlackRequest.objects.create(signature=signature[:80], at=timezone.now())
    except IntegrityError:
        raise _refuse(
            origin, 401, "slack_replayed", "This signed Slack request was received before."
        ) from None


def slack_requests_prune() -> int:
    """Forget signatures older than Slack's window twice over: they are stale by then anyway."""
    before = timezone.now() - timedelta(seconds=2 * MAX_AGE_SECONDS)
    deleted, _ = SlackRequest.objects.filter(at__lt=before).delete()
    return deleted


# Linking ------------------------------------------------------------------------------------


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.strip().upper().encode()).hexdigest()


@transaction.atomic
def slack_link_code_new(*, user: User) -> str:
    """A one-time code for the reviewer to send from Slack (`/toolgate link CODE`); shown once,
    kept as its hash, valid for TOOLGATE_SLACK_LINK_CODE_MINUTES. A link they had stays until
    the new one is proven."""
    code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(CODE_LENGTH))
    expires = timezone.now() + timedelta(minutes=settings.TOOLGATE_SLACK_LINK_CODE_MINUTES)
    SlackLink.objects.update_or_create(
        user=user, defaults={"code_hash": _code_hash(code), "code_expires_at": expires}
    )
    return code


def _team_checked(origin: Origin, team_id: str) -> None:
    expected = settings.TOOLGATE_SLACK_TEAM_ID
    if not expected or team_id != expected:
        raise _refuse(
            origin,
            403,
            "slack_team_unknown",
            f"The Slack workspace {team_id[:32]!r} is not the one Toolgate accepts.",
        )


def slack_link_prove(*, origin: Origin, team_id: str, slack_user_id: str, code: str) -> User:
    """Link the Slack user who sent the code to the reviewer it was shown to; the reviewer.
    Raises SlackRefused, recorded once the link's transaction is over."""
    _team_checked(origin, team_id)
    try:
        return _link_prove(team_id, slack_user_id, code)
    except SlackRefused as exc:
        raise _refuse(origin, exc.status, exc.reason, exc.message) from None


@transaction.atomic
def _link_prove(team_id: str, slack_user_id: str, code: str) -> User:
    now = timezone.now()
    link = (
        SlackLink.objects.select_for_update()
        .select_related("user")
        .filter(code_hash=_code_hash(code), code_expires_at__gt=now)
        .exclude(code_hash="")
        .first()
    )
    if link is None:
        raise SlackRefused(
            403,
            "slack_link_code_invalid",
            "That code is unknown or expired: make a new one on Toolgate's Slack page.",
        )
    taken = (
        SlackLink.objects.filter(team_id=team_id, slack_user_id=slack_user_id)
        .exclude(pk=link.pk)
        .exists()
    )
    if taken:
        raise SlackRefused(
            409,
            "slack_user_linked_elsewhere",
            "This Slack user is linked to another reviewer already.",
        )
    link.team_id, link.slack_user_id, link.linked_at = team_id, slack_user_id, now
    link.code_hash, link.code_expires_at = "", None
    link.save(
        update_fields=["team_id", "slack_user_id", "linked_at", "code_hash", "code_expires_at"]
    )
    return link.user


def slack_reviewer(*, origin: Origin, team_id: str, slack_user_id: str) -> User:
    """The reviewer this Slack user was linked to, who may still decide; raises SlackRefused."""
    _team_checked(origin, team_id)
    link = (
        SlackLink.objects.select_related("user")
        .filter(team_id=team_id, slack_user_id=slack_user_id)
        .exclude(slack_user_id="")
        .first()
    )
    if link is None:
        raise _refuse(
            origin,
            403,
            "slack_user_unlinked",
            "This Slack user is linked to no reviewer: link it from Toolgate's Slack page first.",
        )
    if not is_reviewer(link.user):
        raise _refuse(
            origin,
            403,
            "slack_reviewer_without_right",
            f"{link.user.get_username()} may not decide held calls (not an active reviewer).",
        )
    return link.user


# The button ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlackAction:
    team_id: str
    slack_user_id: str
    action_id: str
    confirmation_id: str
    channel_id: str

    @classmethod
    def of(cls, payload: dict[str, Any]) -> SlackAction | None:
        """The first action of a block_actions payload, or None if it is not one."""
        if payload.get("type") != "block_actions":
            return None
        actions = payload.get("actions") or []
        if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
            return None
        team, user = payload.get("team") or {}, payload.get("user") or {}
        channel = payload.get("channel") or {}
        if not all(isinstance(part, dict) for part in (team, user, channel)):
            return None
        return cls(
            team_id=str(team.get("id", ""))[:32],
            slack_user_id=str(user.get("id", ""))[:32],
            action_id=str(actions[0].get("action_id", ""))[:64],
            confirmation_id=str(actions[0].get("value", ""))[:32],
            channel_id=str(channel.get("id", ""))[:32],
        )

    def as_dict(self) -> dict[str, str]:
        return {
            "team_id": self.team_id,
            "slack_user_id": self.slack_user_id,
            "action_id": self.action_id,
            "confirmation_id": self.confirmation_id,
            "channel_id": self.channel_id,
        }


# What the reviewer is told in Slack, by outcome.
APPROVED = "approved"
VOTED = "voted"


def slack_action_decide(action: SlackAction) -> str:
    """Run an Approve press through the decision core as the linked reviewer; what happened, in
    words (also told to the Slack user where it decided nothing)."""
    origin = Origin(SLACK_CHANNEL, "POST", ACTIONS_PATH, None)
    card = site_url(f"/approvals/{action.confirmation_id}/")
    try:
        reviewer = slack_reviewer(
            origin=origin, team_id=action.team_id, slack_user_id=action.slack_user_id
        )
        services.confirmation_approve(
            confirmation_id=action.confirmation_id,
            reviewer=reviewer,
            channel=SLACK_CHANNEL,
            deciding_only=True,
        )
    except SlackRefused as exc:
        words = exc.message
    except (
        services.NeedsCard,
        services.SecondLookRequired,
        services.PossibleDuplicate,
        services.FactorRequired,
    ) as exc:
        words = f"Not decided from Slack: {exc.message} Open the card: {card}"
    except services.ConfirmationError as exc:
        words = f"Not decided: {exc.message}"
    else:
        # The message itself says so to everyone (notifications.slack_messages_update).
        return APPROVED
    if action.channel_id and action.slack_user_id:
        try:
            slack_ephemeral(
                channel=action.channel_id, slack_user_id=action.slack_user_id, text=words
            )
        except ChannelFailed as exc:
            logger.warning("Could not tell the Slack user why: %s", exc)
    return words


@shared_task(acks_late=True, ignore_result=True)
def slack_action_task(action: dict[str, str]) -> str:
    return slack_action_decide(SlackAction(**action))


def slack_action_accept(payload: dict[str, Any]) -> bool:
    """Hand an Approve press to the workers, so that Slack is answered at once; whether it was
    one to act on (a press of "Open the card" needs nothing)."""
    action = SlackAction.of(payload)
    if action is None or action.action_id != APPROVE_ACTION:
        return False
    slack_action_task.delay(action.as_dict())
    return True


def slack_is_reviewer_command(text: str) -> str | None:
    """The code of a `/toolgate link CODE` command's text, or None."""
    words = text.split()
    if len(words) == 2 and words[0].lower() == "link":
        return words[1]
    return None

"""The doors of the notification channels: an e-mail's signed link, Slack's interactivity and
slash command endpoints, and the reviewer's page that links their Slack user.

The Slack endpoints are authenticated by Slack's signature (approvals.slack), not by a session,
so they are exempt from CSRF; every other door here needs a signed-in reviewer. Opening a link
or a page never decides: decisions are the card's POSTs (CSRF-protected) and the Slack button.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core import signing
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.models import SlackLink
from approvals.notifying import MAIL_LINK_SALT
from approvals.slack import (
    SlackRefused,
    slack_action_accept,
    slack_is_reviewer_command,
    slack_link_code_new,
    slack_link_prove,
    slack_origin,
    slack_request_verify,
)
from approvals.views import reviewer_required
from dispatch.client_address import client_address
from dispatch.security import Origin, security_event_record

MAIL_CHANNEL = "mail"

logger = logging.getLogger(__name__)


def _mail_refused(
    request: HttpRequest, status: int, reason: str, words: str, *, record: bool
) -> HttpResponse:
    if record:
        origin = Origin(MAIL_CHANNEL, "GET", request.path[:200], client_address(request) or None)
        security_event_record(origin=origin, agent=None, status=status, reason=reason, detail=words)
    return render(
        request, "approvals/mail_link.html", {"words": words, "reason": reason}, status=status
    )


@require_GET
@login_required
def mail_link(request: HttpRequest, token: str) -> HttpResponse:
    """Open the card an e-mail's link names, for the reviewer it was sent to, until the call
    expires; as often as they like (mail scanners follow links too). It decides nothing."""
    try:
        found = signing.loads(
            token, salt=MAIL_LINK_SALT, max_age=settings.TOOLGATE_MAIL_LINK_MAX_AGE_SECONDS
        )
    except signing.SignatureExpired:
        return _mail_refused(
            request,
            410,
            "mail_link_expired",
            "This link has expired: open the queue instead.",
            record=False,
        )
    except signing.BadSignature:
        return _mail_refused(
            request, 400, "mail_link_forged", "This link is not one Toolgate signed.", record=True
        )
    if not isinstance(found, dict) or not {"c", "u", "e"} <= found.keys():
        return _mail_refused(
            request, 400, "mail_link_forged", "This link is not one Toolgate signed.", record=True
        )
    user = request.user
    assert isinstance(user, User)
    if found["u"] != user.pk:
        return _mail_refused(
            request,
            403,
            "mail_link_other_reviewer",
            "This link was sent to another reviewer: it opens nothing for you.",
            record=True,
        )
    if datetime.fromtimestamp(int(found["e"]), tz=UTC) <= timezone.now():
        return _mail_refused(
            request,
            410,
            "mail_link_expired",
            "This held call has expired, and its link with it. Its card shows how it ended.",
            record=False,
        )
    # The card itself checks the reviewer's right, as for any other way in.
    return HttpResponseRedirect(reverse("approvals:detail", args=[str(found["c"])]))


def _slack_refusal(exc: SlackRefused) -> JsonResponse:
    return JsonResponse({"error": exc.reason, "message": exc.message}, status=exc.status)


@csrf_exempt
@require_POST
def slack_actions(request: HttpRequest) -> HttpResponse:
    """Slack's interactivity request URL: verified, handed to the workers, answered at once."""
    try:
        slack_request_verify(request)
    except SlackRefused as exc:
        return _slack_refusal(exc)
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except ValueError:
        return JsonResponse(
            {"error": "slack_payload_invalid", "message": "The payload is not JSON."}, status=400
        )
    if not isinstance(payload, dict):
        return JsonResponse(
            {"error": "slack_payload_invalid", "message": "The payload is not an object."},
            status=400,
        )
    try:
        slack_action_accept(payload)
    except Exception:
        # The broker is away: nothing was decided, and Slack shows the reviewer an error.
        logger.exception("Could not hand a Slack action to the workers")
        return JsonResponse(
            {"error": "unavailable", "message": "Toolgate cannot take it now; try again."},
            status=503,
        )
    return HttpResponse(status=200)


@csrf_exempt
@require_POST
def slack_commands(request: HttpRequest) -> HttpResponse:
    """The slash command (`/toolgate link CODE`): links the Slack user who sends it."""
    try:
        slack_request_verify(request)
    except SlackRefused as exc:
        return _slack_refusal(exc)
    code = slack_is_reviewer_command(request.POST.get("text", ""))
    if code is None:
        return JsonResponse(
            {
                "response_type": "ephemeral",
                "text": "Send `/toolgate link CODE` with the code Toolgate's Slack page shows you.",
            }
        )
    try:
        user = slack_link_prove(
            origin=slack_origin(request),
            team_id=request.POST.get("team_id", "")[:32],
            slack_user_id=request.POST.get("user_id", "")[:32],
            code=code,
        )
    except SlackRefused as exc:
        return JsonResponse({"response_type": "ephemeral", "text": exc.message})
    return JsonResponse(
        {
            "response_type": "ephemeral",
            "text": f"Linked: your Slack user decides as {user.get_username()} in Toolgate.",
        }
    )


@require_http_methods(["GET", "POST"])
@reviewer_required
def slack_link(request: HttpRequest) -> HttpResponse:
    """The reviewer's Slack link: whether they have one, and a one-time code to prove a new one."""
    user = request.user
    assert isinstance(user, User)
    code = slack_link_code_new(user=user) if request.method == "POST" else ""
    link = SlackLink.objects.filter(user=user).first()
    return render(
        request,
        "approvals/slack_link.html",
        {
            "link": link if link is not None and link.slack_user_id else None,
            "code": code,
            "minutes": settings.TOOLGATE_SLACK_LINK_CODE_MINUTES,
            "configured": bool(settings.SLACK_SIGNING_SECRET and settings.TOOLGATE_SLACK_TEAM_ID),
        },
    )

"""The reviewer's pages: the queue, one confirmation, the history and the reconciliation list.

Reads come from approvals.selectors; every decision goes through approvals.services, whose
refusals (someone else decided first, the item expired) are shown as messages, never as errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_tables2 import RequestConfig

from approvals import selectors, services
from approvals.factors import FactorLocked, factor_check, factor_fresh, factor_mark, has_factor
from approvals.filters import HistoryFilter
from approvals.forms import EditInvalid, RejectForm, edit_changes
from approvals.notifications import failing_channels
from approvals.provider_check import ProviderUserGone
from approvals.reviewers import REVIEWERS_GROUP, is_reviewer
from approvals.tables import ConfirmationTable, TriageTable
from dispatch.models import Confirmation, ConfirmationStatus, IdempotencyRecord
from dispatch.outcomes import outcome_settle
from dispatch.pipeline.state import KeyStatus
from dispatch.security import page_origin, security_event_record
from upstreams.drift_records import drifts_open

logger = logging.getLogger(__name__)

HISTORY_PAGE_SIZE = 25
# What the history lists of a held call: when and how it was decided, and its details.
HISTORY_COLUMNS = (
    "closed_at",
    "amount_cents",
    "subject",
    "customer_id",
    "agent",
    "status",
    "reviewers",
    "why",
    "link",
)

View = Callable[..., HttpResponse]


def reviewer_required(view: View) -> View:
    """Anonymous users go to the login; signed-in users outside the reviewers group get a 403."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_reviewer(request.user):
            raise PermissionDenied(
                "These pages are for reviewers. An administrator can add you to the "
                f"'{REVIEWERS_GROUP}' group."
            )
        return view(request, *args, **kwargs)

    return wrapped


def _reader(request: HttpRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


@require_GET
@reviewer_required
def queue(request: HttpRequest) -> HttpResponse:
    reader = _reader(request)
    items = selectors.queue_items(reader=reader, limit=selectors.QUEUE_SHOWN)
    context = {
        "items": items,
        "pending_total": selectors.pending_count(),
        "what_is_held": selectors.what_is_held(),
        "in_flight": selectors.in_flight_items(reader=reader),
        "unknown_count": selectors.unknown_count(),
        "refresh_seconds": settings.TOOLGATE_QUEUE_REFRESH_SECONDS,
        "next": reverse("approvals:queue"),
        "stuck_after_minutes": settings.TOOLGATE_STUCK_AFTER_MINUTES,
        # A channel that keeps failing, for the administrators who can fix it.
        "failing_channels": failing_channels() if reader.is_staff else [],
        # So is an upstream whose answers or tools moved away from its declarations.
        "drifting_upstreams": drifts_open() if reader.is_staff else [],
        "slack_configured": bool(settings.SLACK_SIGNING_SECRET),
    }
    if getattr(request, "htmx", False):
        context["decided_elsewhere"] = _decided_elsewhere(request, items, reader)
        return render(request, "approvals/_queue.html", context)
    return render(request, "approvals/queue.html", context)


def _decided_elsewhere(
    request: HttpRequest, items: list[selectors.ReviewItem], reader: User
) -> list[selectors.DecidedElsewhere]:
    """The page's own refresh: a word about each item it showed that someone else (or the
    expiry) settled meanwhile."""
    still_pending = {item.id for item in items}
    shown = [cid for cid in request.GET.getlist("shown") if cid not in still_pending]
    return selectors.decided_elsewhere(shown, reader=reader)


@require_GET
@reviewer_required
def triage(request: HttpRequest) -> HttpResponse:
    """The queue as a compact list, a row a held call; choosing a row opens its card."""
    reader = _reader(request)
    items = selectors.queue_items(reader=reader, limit=selectors.QUEUE_SHOWN)
    here = reverse("approvals:triage")
    context = {
        "items": items,
        "table": TriageTable(items, next_url=here, csrf_token=get_token(request)),
        "pending_total": selectors.pending_count(),
        "what_is_held": selectors.what_is_held(),
        "refresh_seconds": settings.TOOLGATE_QUEUE_REFRESH_SECONDS,
        "next": here,
    }
    if getattr(request, "htmx", False):
        context["decided_elsewhere"] = _decided_elsewhere(request, items, reader)
        return render(request, "approvals/_triage.html", context)
    return render(request, "approvals/triage.html", context)


@require_GET
@reviewer_required
def detail(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    item = selectors.confirmation_item(confirmation_id=confirmation_id, reader=_reader(request))
    if item is None:
        raise Http404("No such confirmation.")
    return render(
        request,
        "approvals/detail.html",
        {
            "item": item,
            "next": reverse("approvals:detail", args=[item.id]),
            # From the list's Reject: the card opens with its reason to write.
            "reject_open": request.GET.get("reject") == "1",
        },
    )


def _decide(
    request: HttpRequest,
    confirmation_id: str,
    decision: Callable[[], Confirmation],
    *,
    default: str = "",
) -> HttpResponse:
    """Run a service's decision, say its outcome or why it could not be made, and go back."""
    try:
        confirmation = decision()
    except ProviderUserGone as exc:
        return _provider_gone(request, confirmation_id, exc)
    except services.ConfirmationError as exc:
        messages.error(request, exc.message)
    else:
        _tell_outcome(request, confirmation)
    return _back(request, confirmation_id, default=default)


def _provider_gone(
    request: HttpRequest, confirmation_id: str, exc: ProviderUserGone
) -> HttpResponse:
    """The identity provider no longer vouches for the reviewer: nothing was decided; on record,
    their session ends, and the login page says why."""
    security_event_record(
        origin=page_origin(request),
        agent=Confirmation.objects.get(pk=confirmation_id).agent,
        status=403,
        reason=exc.code,
        detail=f"{_reader(request).get_username()} deciding {confirmation_id}",
    )
    logout(request)
    messages.error(request, exc.message)
    return redirect(settings.LOGIN_URL)


@require_POST
@reviewer_required
def approve(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    _existing(confirmation_id)
    # The second, deliberate action of a possible duplicate's form.
    separate = request.POST.get("separate") == "yes"
    try:
        confirmation = services.confirmation_approve(
            confirmation_id=confirmation_id,
            reviewer=_reader(request),
            separate=separate,
            # The second look that an amount above the policy's confirm_above needs.
            confirmed=request.POST.get("confirmed") == "yes",
            # A second factor given on the step-up page within the last minutes.
            factor=factor_fresh(request),
        )
    except services.FactorRequired as exc:
        return _factor_required(request, confirmation_id, exc)
    except ProviderUserGone as exc:
        return _provider_gone(request, confirmation_id, exc)
    except services.SecondLookRequired as exc:
        # Nothing was recorded: the card again, asking once more, and a 400 for a script.
        return _second_look(request, confirmation_id, exc.message, separate=separate)
    except services.ConfirmationError as exc:
        messages.error(request, exc.message)
    else:
        _tell_outcome(request, confirmation)
    return _back(request, confirmation_id)


@require_POST
@reviewer_required
def edit(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    """Edit a held call as its tool allows, then approve the edited call (a new confirmation,
    which takes its place). A refused edit changes nothing and says why."""
    confirmation = Confirmation.objects.filter(pk=confirmation_id).first()
    if confirmation is None:
        raise Http404("No such confirmation.")
    try:
        changes = edit_changes(
            request.POST, selectors.edit_fields(confirmation), confirmation.arguments
        )
        edited = services.confirmation_edit_approve(
            confirmation_id=confirmation_id,
            reviewer=_reader(request),
            changes=changes,
            separate=request.POST.get("separate") == "yes",
            confirmed=request.POST.get("confirmed") == "yes",
            factor=factor_fresh(request),
        )
    except services.FactorRequired as exc:
        return _factor_required(request, confirmation_id, exc)
    except ProviderUserGone as exc:
        return _provider_gone(request, confirmation_id, exc)
    except EditInvalid as exc:
        messages.error(request, f"Not edited: {exc}")
        return _back(request, confirmation_id)
    except services.ConfirmationError as exc:
        messages.error(request, f"Not edited: {exc.message}")
        return _back(request, confirmation_id)
    _tell_outcome(request, edited)
    on_its_page = reverse("approvals:detail", args=[confirmation_id])
    if _next(request, "") == on_its_page:
        # Its page now shows a superseded call: the edited one's instead.
        response = HttpResponseRedirect(reverse("approvals:detail", args=[edited.pk]))
        response.status_code = 303
        return response
    return _back(request, confirmation_id)


def _second_look(
    request: HttpRequest, confirmation_id: str, message: str, *, separate: bool
) -> HttpResponse:
    item = selectors.confirmation_item(confirmation_id=confirmation_id, reader=_reader(request))
    assert item is not None
    messages.warning(request, message)
    return render(
        request,
        "approvals/detail.html",
        {
            "item": item,
            "next": _next(request, reverse("approvals:detail", args=[item.id])),
            "second_look_open": item.id,
            "second_look_separate": separate,
        },
        status=400,
    )


@reviewer_required
def factor(request: HttpRequest) -> HttpResponse:
    """The step-up page: a code from the reviewer's authenticator app (or a recovery code), which
    keeps their second factor fresh for TOOLGATE_FACTOR_FRESH_SECONDS, then back to the card."""
    target = _next_of(request, str(request.POST.get("next") or request.GET.get("next") or ""))
    if request.method != "POST":
        return _factor_page(request, target)
    code = str(request.POST.get("code", ""))[:64]
    try:
        valid = factor_check(request=request, user=_reader(request), code=code, recovery=True)
    except FactorLocked:
        return _factor_page(
            request,
            target,
            reason="Too many wrong codes: wait for the lockout to end, as after wrong passwords.",
            status=429,
        )
    if not valid:
        return _factor_page(
            request,
            target,
            reason="That code is wrong, or was used already: enter the one your app shows now.",
            status=400,
        )
    factor_mark(request)
    messages.success(request, "Second factor given: approve again.")
    response = HttpResponseRedirect(target)
    response.status_code = 303
    return response


def _factor_required(
    request: HttpRequest, confirmation_id: str, exc: services.ConfirmationError
) -> HttpResponse:
    """Nothing was recorded: a 403 with the reason, on record, and the step-up page that takes
    the reviewer back to the card."""
    security_event_record(
        origin=page_origin(request),
        agent=Confirmation.objects.get(pk=confirmation_id).agent,
        status=403,
        reason=exc.code,
        detail=f"{_reader(request).get_username()} approving {confirmation_id} "
        "without a fresh second factor",
    )
    return _factor_page(
        request,
        _next(request, reverse("approvals:detail", args=[confirmation_id])),
        reason=exc.message,
        status=403,
    )


def _factor_page(
    request: HttpRequest, target: str, *, reason: str = "", status: int = 200
) -> HttpResponse:
    return render(
        request,
        "approvals/factor.html",
        {
            "next": target,
            "reason": reason,
            "enrolled": has_factor(_reader(request)),
            "fresh_minutes": max(1, round(settings.TOOLGATE_FACTOR_FRESH_SECONDS / 60)),
        },
        status=status,
    )


def _next_of(request: HttpRequest, target: str) -> str:
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ) or not target.startswith("/"):
        return reverse("approvals:queue")
    return target


@require_POST
@reviewer_required
def reject(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    _existing(confirmation_id)
    form = RejectForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.as_data().values():
            for error in errors:
                for message in error.messages:
                    messages.error(request, message)
        return _back(request, confirmation_id)
    return _decide(
        request,
        confirmation_id,
        lambda: services.confirmation_reject(
            confirmation_id=confirmation_id,
            reviewer=_reader(request),
            reason=form.cleaned_data["reason"],
        ),
    )


@require_POST
@reviewer_required
def reconcile(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    _existing(confirmation_id)
    return _decide(
        request,
        confirmation_id,
        lambda: services.confirmation_reconcile(
            confirmation_id=confirmation_id, reviewer=_reader(request)
        ),
        default=reverse("approvals:reconciliation"),
    )


@require_GET
@reviewer_required
def history(request: HttpRequest) -> HttpResponse:
    filters = HistoryFilter(request.GET, queryset=selectors.history_queryset())
    table = ConfirmationTable(filters.qs, columns=HISTORY_COLUMNS)
    RequestConfig(request, paginate={"per_page": HISTORY_PAGE_SIZE}).configure(table)
    return render(
        request,
        "approvals/history.html",
        {
            "filter": filters,
            "table": table,
            "filtered": filters.is_bound and any(request.GET.values()),
        },
    )


@require_GET
@reviewer_required
def reconciliation(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "approvals/reconciliation.html",
        {
            "items": selectors.reconciliation_items(reader=_reader(request)),
            "direct": selectors.direct_outcomes(),
            "what_is_held": selectors.what_is_held(),
            "next": reverse("approvals:reconciliation"),
        },
    )


# What a person is told once a direct call's outcome was asked for, by what the key became.
_SETTLED_WORDS = {
    KeyStatus.COMPLETED: (
        messages.SUCCESS,
        "The system of record has it: {tool} took effect, and the same call now gets its result.",
    ),
    KeyStatus.OPEN: (
        messages.SUCCESS,
        "The system of record has nothing of it: {tool} did not take effect and its money no "
        "longer counts. The same call may be sent again.",
    ),
    KeyStatus.UNKNOWN: (
        messages.ERROR,
        "The system of record of {tool} could not be asked now; it stays unknown. Try again "
        "shortly.",
    ),
    KeyStatus.IN_PROGRESS: (
        messages.INFO,
        "The same call was sent again and is finishing {tool} now.",
    ),
}


@require_POST
@reviewer_required
def settle_outcome(request: HttpRequest, key: str) -> HttpResponse:
    """Ask a direct call's system of record what became of it, and settle its key."""
    record = IdempotencyRecord.objects.filter(pk=key, confirmation_id="").first()
    if record is None:
        raise Http404("No such direct call.")
    settled = outcome_settle(key=key)
    logger.info(
        "outcome of %s %s asked by %s: %s",
        record.tool,
        key[:12],
        _reader(request).username,
        settled.status if settled is not None else "not settleable now",
    )
    if settled is None:
        messages.info(
            request,
            "Nothing to settle now: it is settled already, its process may still be making it, "
            "someone else is asking, or its tool declares no read of its outcome (the same call "
            "sent again settles it).",
        )
    else:
        level, words = _SETTLED_WORDS.get(
            KeyStatus(settled.status), _SETTLED_WORDS[KeyStatus.UNKNOWN]
        )
        messages.add_message(request, level, words.format(tool=settled.tool))
    return HttpResponseRedirect(_next(request, reverse("approvals:reconciliation")))


def _existing(confirmation_id: str) -> None:
    if not Confirmation.objects.filter(pk=confirmation_id).exists():
        raise Http404("No such confirmation.")


def _back(request: HttpRequest, confirmation_id: str, *, default: str = "") -> HttpResponse:
    """Back to the page the form was on (a local path only), after the POST (303: a reload
    does not submit it again)."""
    response = HttpResponseRedirect(_next(request, default or reverse("approvals:queue")))
    response.status_code = 303
    return response


def _next(request: HttpRequest, default: str) -> str:
    """The page the form was on, a local path only; else `default`."""
    target = str(request.POST.get("next", ""))
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ) or not target.startswith("/"):
        return default
    return target


def _tell_outcome(request: HttpRequest, confirmation: Confirmation) -> None:
    """Say where the confirmation stands after the reviewer's action."""
    item = selectors.confirmation_item(confirmation_id=confirmation.pk, reader=_reader(request))
    assert item is not None
    what = f"{item.tool_label} {item.title}".strip()
    status = item.status
    result = confirmation.result if isinstance(confirmation.result, dict) else {}
    if status == ConfirmationStatus.PENDING:
        messages.info(
            request,
            f"Your approval of {what} is recorded. {item.approvals.still_needed}.",
        )
    elif status == ConfirmationStatus.APPROVED:
        messages.success(
            request,
            f"Approved: {what} executes as soon as a worker takes it. It is kept until then, "
            "and sent again if no worker took it within a minute.",
        )
    elif status == ConfirmationStatus.EXECUTING:
        messages.success(request, f"Approved: {what} is being executed.")
    elif status == ConfirmationStatus.EXECUTED:
        messages.success(request, f"Executed: {what}.")
    elif status == ConfirmationStatus.REJECTED:
        messages.success(request, f"Rejected: {what}. The agent is told your reason.")
    elif status == ConfirmationStatus.INVALIDATED:
        messages.warning(
            request,
            f"Not executed: {what} no longer passes its checks. {confirmation.decision_reason}",
        )
    elif status == ConfirmationStatus.FAILED:
        messages.error(
            request, f"The execution of {what} failed; nothing moved. {result.get('message', '')}"
        )
    elif status == ConfirmationStatus.UNKNOWN:
        messages.warning(
            request,
            f"The outcome of {what} is unknown: settle it in Reconciliation before anything "
            "else is done about it.",
        )
    else:
        messages.info(request, f"{what} is {status}.")

"""Each user's places: what the navigation, the home page and the login's landing show them.

A place is shown only to those who may open it: reviewers get their queue (with the count of
pending items) and the orders, managers the figures and the records they read, administrators
the admin, which is kept for configuration (agents, policies, users).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.text import capfirst

from analytics.permissions import is_manager
from approvals.models import PolicyChange, PolicyChangeStatus
from approvals.reviewers import is_reviewer
from approvals.selectors import pending_count, unknown_count, what_is_held


@dataclass(frozen=True, slots=True)
class Place:
    label: str
    url: str
    description: str
    # Shown beside the label (pending items); None shows nothing.
    count: int | None = None
    # The id of the count's element, which a page's own refresh may update.
    count_id: str = ""


# What makes a staff user an administrator: changing the configuration the admin is kept for.
_CONFIGURATION = (
    "dispatch.add_agent",
    "dispatch.change_agent",
    "dispatch.add_policy",
    "auth.add_user",
    "auth.change_user",
)


def _administers(user: AbstractBaseUser | AnonymousUser) -> bool:
    if getattr(user, "is_superuser", False):
        return True
    return (
        isinstance(user, PermissionsMixin)
        and getattr(user, "is_staff", False)
        and any(user.has_perm(permission) for permission in _CONFIGURATION)
    )


def places_for(user: AbstractBaseUser | AnonymousUser) -> list[Place]:
    if not user.is_authenticated or not user.is_active:
        return []
    places = []
    if is_reviewer(user):
        unknown = unknown_count()
        places += [
            Place(
                "Approvals",
                reverse("approvals:queue"),
                f"{capfirst(what_is_held())} waiting for your decision, the soonest to "
                "expire first.",
                count=pending_count(),
                count_id="nav-pending-count",
            ),
            Place(
                "History",
                reverse("approvals:history"),
                "Decided items, with filters by status, reviewer, agent and date.",
            ),
            Place(
                "Reconciliation",
                reverse("approvals:reconciliation"),
                "Executions whose outcome is unknown, to settle with the gateway.",
                count=unknown or None,
            ),
        ]
    manager = is_manager(user)
    if manager:
        places += [
            Place(
                "Analytics",
                reverse("analytics:dashboard"),
                "Where tool calls fail, why, whether the models recover, how reviewers decide.",
            ),
            Place(
                "Calls",
                reverse("analytics:calls"),
                "Every tool call, what it sent and what it was told, by agent, customer or text.",
            ),
            Place(
                "Confirmations",
                reverse("records:confirmations"),
                "Held calls in every state, and how and by whom they were decided.",
            ),
            Place(
                "Security events",
                reverse("records:security"),
                "Requests the agent API refused, and why.",
            ),
        ]
    if manager or is_reviewer(user):
        places.append(
            Place(
                "Orders",
                reverse("records:orders"),
                "Orders with their refunds: what was refunded, by whom, and what remains.",
            )
        )
    if manager:
        places.append(
            Place(
                "Policy what-if",
                reverse("analytics:what-if"),
                "What a change to an agent's money thresholds would have done to its calls.",
            )
        )
        drafts = PolicyChange.objects.filter(status=PolicyChangeStatus.DRAFT).count()
        places.append(
            Place(
                "Policy changes",
                reverse("analytics:policy-changes"),
                "Changes to policies and reviewers' limits, each approved by a second manager.",
                count=drafts or None,
            )
        )
    if manager or is_reviewer(user):
        places.append(
            Place(
                "Second factor",
                reverse("mfa_index"),
                "Your authenticator app and recovery codes: approvals above a policy's line ask "
                "for a code.",
            )
        )
    if _administers(user):
        places.append(Place("Admin", reverse("admin:index"), "Agents and their policies, users."))
        places.append(
            Place(
                "Books",
                reverse("books:breaches"),
                "Where the books disagree with themselves: ledgers, limits, executions.",
            )
        )
    return places


def landing_url(user: AbstractBaseUser | AnonymousUser) -> str:
    """Where a user lands after logging in: an admin in the admin, a reviewer in the queue,
    anyone else on the home page that lists their places."""
    if getattr(user, "is_superuser", False):
        return reverse("admin:index")
    if is_reviewer(user):
        return reverse("approvals:queue")
    if is_manager(user):
        return reverse("analytics:dashboard")
    return reverse("home")


def navigation(request: HttpRequest) -> dict[str, Any]:
    """The context processor: the signed-in user's places, read only by a page that shows them
    (the admin's pages do not)."""
    user = getattr(request, "user", None)
    if user is None:
        return {"places": []}
    return {"places": SimpleLazyObject(lambda: places_for(user))}

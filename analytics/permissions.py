"""Who may read what managers read: one rule, for the pages and the API alike.

A manager is an active user in the `managers` group. Being a superuser does not make one: the
group is the only way in, as the reviewers' group is for reviewers (approvals/reviewers.py), so
that who reads the figures is who an administrator put there, themselves included. A session's
timeline and a call's page are also open to reviewers: it is what the agent did before the call
they are asked about.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

# Who is a manager is approvals' rule (managers also approve policy changes); read here with it.
from approvals.reviewers import MANAGERS_GROUP as MANAGERS_GROUP
from approvals.reviewers import REVIEWERS_GROUP, is_reviewer
from approvals.reviewers import is_manager as is_manager

Reader = AbstractBaseUser | AnonymousUser
View = Callable[..., HttpResponseBase]


def is_manager_or_reviewer(user: Reader | object) -> bool:
    return is_manager(user) or is_reviewer(user)


def _only(rule: Callable[[Reader], bool], *groups: str) -> Callable[[View], View]:
    """Anonymous users go to the login; signed-in users the rule leaves out get a 403."""
    denied = (
        "This page is for members of the "
        + " or ".join(f"'{group}'" for group in groups)
        + " group. An administrator can add you."
    )

    def decorate(view: View) -> View:
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not rule(request.user):
                raise PermissionDenied(denied)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


managers_only = _only(is_manager, MANAGERS_GROUP)
managers_and_reviewers = _only(is_manager_or_reviewer, MANAGERS_GROUP, REVIEWERS_GROUP)


class IsManager(BasePermission):
    """The API's side of the same rule."""

    message = "Only managers may read the metrics."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return is_manager(request.user)

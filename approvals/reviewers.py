"""Who reviews: the members of the `reviewers` group, in the browser or with a personal token.

A personal token is shown once and kept as a SHA-256 hash, like an agent's; a user has at most
one, and a new one replaces it. It opens what the user's groups open, no more.
"""

from __future__ import annotations

import secrets

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import transaction

from approvals.models import ReviewerToken
from dispatch.services import token_hash

REVIEWERS_GROUP = "reviewers"
# Managers read the figures (analytics) and approve one another's policy changes.
MANAGERS_GROUP = "managers"
TOKEN_PREFIX = "tgr_"


def is_reviewer(user: AbstractBaseUser | AnonymousUser | object) -> bool:
    return (
        isinstance(user, User)
        and user.is_active
        and user.groups.filter(name=REVIEWERS_GROUP).exists()
    )


def is_manager(user: AbstractBaseUser | AnonymousUser | object) -> bool:
    return (
        isinstance(user, User)
        and user.is_active
        and user.groups.filter(name=MANAGERS_GROUP).exists()
    )


@transaction.atomic
def reviewer_token_create(*, user: User) -> str:
    """A new personal token for the user, replacing the one they had; returned once, never kept."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ReviewerToken.objects.update_or_create(
        user=user, defaults={"token_prefix": token[:10], "token_hash": token_hash(token)}
    )
    return token


def reviewer_authenticate(token: str) -> User | None:
    """The active user whose personal token this is, or None."""
    found = (
        ReviewerToken.objects.select_related("user")
        .filter(token_hash=token_hash(token), user__is_active=True)
        .first()
    )
    return None if found is None else found.user

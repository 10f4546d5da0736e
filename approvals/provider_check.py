"""Whether a single sign-on user still works here, as their identity provider says
(docs/identity.md).

Before a reviewer's decision moves money (approve, edit, reject; on the pages, the approvals API
and Slack), a user who logs in with the provider needs a check by the provider younger than
TOOLGATE_OIDC_CHECK_SECONDS: their login, or a call to the provider's userinfo endpoint with the
access token kept from it (refreshed first with its refresh token once it expired). The
provider refusing the token (the user disabled or removed there) ends their access here: their
reviewer API token is deleted and their kept tokens with it, so every later check fails until
they log in with the provider again. The provider that cannot be reached decides nothing.
Local users (no provider account) are not checked.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import requests
from allauth.socialaccount.models import SocialAccount, SocialToken
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from approvals.errors import ConfirmationError
from approvals.models import ReviewerToken

logger = logging.getLogger(__name__)

PROVIDER_ID = "sso"
TIMEOUT_SECONDS = 5


class ProviderUserGone(ConfirmationError):
    """The provider says the user is disabled or removed there: nothing is decided, and the
    user's access here ends."""

    code = "provider_user_gone"


class ProviderCheckUnavailable(ConfirmationError):
    """The provider could not be asked now: nothing is decided; the same action may pass once it
    answers."""

    code = "provider_check_unavailable"


def _checked_key(user: User) -> str:
    return f"toolgate:provider-checked:{user.pk}"


def provider_checked(user: User) -> None:
    """The provider vouched for the user just now (their login, or a check)."""
    cache.set(_checked_key(user), time.time(), timeout=settings.TOOLGATE_OIDC_CHECK_SECONDS)


def provider_check(user: User) -> None:
    """Raise ProviderUserGone (after ending the user's access) or ProviderCheckUnavailable unless
    the user is local, or the provider vouched for them within TOOLGATE_OIDC_CHECK_SECONDS."""
    account = SocialAccount.objects.filter(user=user, provider=PROVIDER_ID).first()
    if account is None:
        return
    checked = cache.get(_checked_key(user))
    if isinstance(checked, int | float) and (
        time.time() - checked < settings.TOOLGATE_OIDC_CHECK_SECONDS
    ):
        return
    token = SocialToken.objects.filter(account=account).first()
    if token is None:
        # Ended here already, or never kept: only a new login with the provider vouches again.
        raise _gone(user, "no token of the provider is kept: log in with it again")
    try:
        _ask(token)
    except _Refused as refused:
        raise _gone(user, str(refused)) from None
    except (requests.RequestException, ValueError) as exc:
        logger.warning("The identity provider could not be asked about %s: %s", user, exc)
        raise ProviderCheckUnavailable(
            "Your identity provider could not be reached to confirm your access; nothing was "
            "decided. Try again shortly."
        ) from None
    provider_checked(user)


class _Refused(Exception):
    """The provider refused the user's token."""


def _ask(token: SocialToken) -> None:
    """The provider's userinfo answers for the token (refreshed first if it expired); _Refused
    if the provider refuses it, requests' errors if it cannot be asked."""
    expired = token.expires_at is not None and token.expires_at <= timezone.now()
    if expired and not token.token_secret:
        raise _Refused("the provider's access token expired: log in with it again")
    config = _configuration()
    if expired:
        _refresh(token, config)
    answer = requests.get(
        config["userinfo_endpoint"],
        headers={"Authorization": f"Bearer {token.token}"},
        timeout=TIMEOUT_SECONDS,
    )
    if answer.status_code in (400, 401, 403):
        raise _Refused(f"the provider refused the user ({answer.status_code})")
    answer.raise_for_status()


def _refresh(token: SocialToken, config: dict[str, Any]) -> None:
    app = _app()
    answer = requests.post(
        config["token_endpoint"],
        data={"grant_type": "refresh_token", "refresh_token": token.token_secret},
        auth=(app["client_id"], app["secret"]),
        timeout=TIMEOUT_SECONDS,
    )
    if answer.status_code in (400, 401):
        raise _Refused(f"the provider refused the refresh token ({answer.status_code})")
    answer.raise_for_status()
    data = answer.json()
    token.token = data["access_token"]
    token.token_secret = data.get("refresh_token") or token.token_secret
    expires_in = data.get("expires_in")
    token.expires_at = timezone.now() + timedelta(seconds=int(expires_in)) if expires_in else None
    token.save(update_fields=["token", "token_secret", "expires_at"])


def _app() -> dict[str, Any]:
    apps: list[dict[str, Any]] = settings.SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"]
    for app in apps:
        if app["provider_id"] == PROVIDER_ID:
            return app
    raise ValueError("no identity provider is configured")


def _configuration() -> dict[str, Any]:
    url = str(_app()["settings"]["server_url"]).rstrip("/")
    if "/.well-known/" not in url:
        url += "/.well-known/openid-configuration"
    answer = requests.get(url, timeout=TIMEOUT_SECONDS)
    answer.raise_for_status()
    config: dict[str, Any] = answer.json()
    return config


def _gone(user: User, why: str) -> ProviderUserGone:
    """End the user's access here: their reviewer API token and the provider's tokens kept."""
    logger.warning("The identity provider no longer vouches for %s: %s", user, why)
    with transaction.atomic():
        ReviewerToken.objects.filter(user=user).delete()
        SocialToken.objects.filter(account__user=user).delete()
    cache.delete(_checked_key(user))
    return ProviderUserGone(
        "Your identity provider no longer confirms your access; nothing was decided and you "
        "were logged out. Log in with it again."
    )

"""A reviewer's second factor, as the doors that approve check it (docs/identity.md).

Above its policy's line (factor_above) an approval needs a fresh second factor; the decision
core refuses it without one, and each door says whether the reviewer gave one: the pages from
the session, marked when a code was given on the step-up page and fresh for
TOOLGATE_FACTOR_FRESH_SECONDS; the approvals API from a TOTP code in the request itself. A
single sign-on user's provider may vouch for the factor instead: its ID token's `amr` or `acr`
says a second factor was given at its `auth_time`, which marks the session as the step-up page
does (provider_factor_at).

The codes are django-allauth's MFA: an authenticator app (TOTP) a user enrols on allauth's pages,
and its recovery codes. A TOTP code is good once within its window (allauth marks it used); a
wrong one counts as a failed login in axes' lockout, which then refuses the user's codes from
that address as it refuses their password.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from allauth.mfa.models import Authenticator
from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
from allauth.mfa.totp.internal.auth import TOTP
from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest

_FRESH_KEY = "toolgate_factor_at"


class FactorLocked(Exception):
    """Too many wrong codes (or passwords) of this user from this address: axes' lockout."""


def has_factor(user: User) -> bool:
    """Whether the user enrolled an authenticator app."""
    return bool(Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists())


def factor_check(*, request: HttpRequest, user: User, code: str, recovery: bool = False) -> bool:
    """Whether `code` is the user's TOTP code of now, not used before (or, with `recovery`, one of
    their unused recovery codes, which it uses up). A wrong code counts against the lockout;
    FactorLocked once it is reached."""
    credentials = {"username": user.get_username()}
    if AxesProxyHandler.is_locked(request, credentials):
        raise FactorLocked
    code = code.strip().replace(" ", "")
    valid = False
    kinds = [Authenticator.Type.TOTP, *([Authenticator.Type.RECOVERY_CODES] if recovery else [])]
    for authenticator in Authenticator.objects.filter(user=user, type__in=kinds):
        wrapped = authenticator.wrap()
        if isinstance(wrapped, TOTP | RecoveryCodes) and wrapped.validate_code(code):
            valid = True
            break
    if not valid:
        user_login_failed.send(sender=__name__, credentials=credentials, request=request)
        if AxesProxyHandler.is_locked(request, credentials):
            raise FactorLocked
    return valid


def factor_mark(request: HttpRequest, at: float | None = None) -> None:
    """The user gave their second factor on the pages just now (or, `at`, at their provider's
    login)."""
    request.session[_FRESH_KEY] = time.time() if at is None else at


def provider_factor_at(claims: Mapping[str, Any], now: float) -> float | None:
    """When the user gave their second factor at their identity provider, as its ID token says:
    its `auth_time`, if its `amr` names a method TOOLGATE_OIDC_FACTOR_AMR counts as a second
    factor or its `acr` is one of TOOLGATE_OIDC_FACTOR_ACR, and that time is within
    TOOLGATE_FACTOR_FRESH_SECONDS of `now` (a minute ahead of it is taken as now: clocks
    differ). None otherwise."""
    amr = claims.get("amr")
    methods = {str(method) for method in amr} if isinstance(amr, list) else set()
    acr = claims.get("acr")
    counted = bool(methods & set(settings.TOOLGATE_OIDC_FACTOR_AMR)) or (
        isinstance(acr, str) and acr in settings.TOOLGATE_OIDC_FACTOR_ACR
    )
    auth_time = claims.get("auth_time")
    if not counted or isinstance(auth_time, bool) or not isinstance(auth_time, int | float):
        return None
    if auth_time > now + 60:
        return None
    at = min(float(auth_time), now)
    fresh_seconds: int = settings.TOOLGATE_FACTOR_FRESH_SECONDS
    return at if now - at <= fresh_seconds else None


def factor_fresh(request: HttpRequest) -> bool:
    """Whether the session's second factor was given within TOOLGATE_FACTOR_FRESH_SECONDS."""
    given = request.session.get(_FRESH_KEY)
    if not isinstance(given, int | float):
        return False
    fresh_seconds: int = settings.TOOLGATE_FACTOR_FRESH_SECONDS
    return 0 <= time.time() - given <= fresh_seconds

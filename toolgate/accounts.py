"""django-allauth, as Toolgate uses it: the second factor's pages (enrolment, recovery codes,
re-authentication), and single sign-on with an OpenID Connect provider (docs/identity.md).
Nobody signs up with a password; a provider's user gets an account at their first login, and
their roles from the provider's groups at every login."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import requests
from allauth.account.adapter import DefaultAccountAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from approvals.factors import factor_mark, provider_factor_at
from approvals.provider_check import provider_checked
from toolgate.navigation import landing_url

logger = logging.getLogger(__name__)

# The roles a provider's groups may give, as TOOLGATE_OIDC_ROLES names them.
REVIEWERS, MANAGERS, ADMINISTRATORS = "reviewers", "managers", "administrators"
ROLES = (REVIEWERS, MANAGERS, ADMINISTRATORS)


class ClosedSignupAdapter(DefaultAccountAdapter):  # type: ignore[misc]
    """Accounts are made by an administrator, or by the provider's login: nobody signs up."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False

    def get_login_redirect_url(self, request: HttpRequest) -> str:
        return landing_url(request.user)

    def get_signup_redirect_url(self, request: HttpRequest) -> str:
        # A provider's user at their first login lands where their role does.
        return landing_url(request.user)

    def post_login(self, request: HttpRequest, user: User, **kwargs: Any) -> HttpResponse:
        sociallogin = (kwargs.get("signal_kwargs") or {}).get("sociallogin")
        if sociallogin is not None:
            provider_login(request, user, sociallogin.account.extra_data or {})
        response: HttpResponse = super().post_login(request, user, **kwargs)
        return response


def provider_login(request: HttpRequest, user: User, extra_data: Mapping[str, Any]) -> None:
    """A login with the provider is its word that the user works here now, and, where its ID
    token says a second factor was given, that factor as of its `auth_time`."""
    provider_checked(user)
    claims = extra_data.get("id_token")
    at = provider_factor_at(claims, time.time()) if isinstance(claims, dict) else None
    if at is not None:
        factor_mark(request, at)


class PasswordLoginBackend(ModelBackend):
    """Django's password check, unless password logins are off (TOOLGATE_PASSWORD_LOGIN): then
    only the user names of TOOLGATE_PASSWORD_LOGIN_USERS log in with a password, on the site's
    login and the admin's alike; everyone else with the provider."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if not password_login_allowed(username):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def password_login_allowed(username: str | None) -> bool:
    if settings.TOOLGATE_PASSWORD_LOGIN:
        return True
    return username is not None and username in settings.TOOLGATE_PASSWORD_LOGIN_USERS


def roles_from_claims(
    claims: Mapping[str, Any], mapping: Mapping[str, str], claim: str
) -> set[str]:
    """The roles the provider's groups give: each role whose mapped group is among them."""
    value = claims.get(claim)
    groups: Iterable[Any] = value if isinstance(value, list) else [value] if value else []
    held = {str(group) for group in groups}
    return {role for role, group in mapping.items() if role in ROLES and group in held}


@transaction.atomic
def user_roles_set(user: User, roles: set[str]) -> None:
    """The user's groups and administrator flags as the provider says, at each login: a group
    removed at the provider is a role removed here."""
    for role in (REVIEWERS, MANAGERS):
        group, _ = Group.objects.get_or_create(name=role)
        if role in roles:
            user.groups.add(group)
        else:
            user.groups.remove(group)
    administrator = ADMINISTRATORS in roles
    if user.is_staff != administrator or user.is_superuser != administrator:
        user.is_staff = user.is_superuser = administrator
        user.save(update_fields=["is_staff", "is_superuser"])


class SingleSignOnAdapter(DefaultSocialAccountAdapter):  # type: ignore[misc]
    """The provider's users get an account at their first login; their roles come from its
    groups claim, mapped by TOOLGATE_OIDC_ROLES, at every login."""

    def is_open_for_signup(self, request: HttpRequest, sociallogin: Any) -> bool:
        return True

    def pre_social_login(self, request: HttpRequest, sociallogin: Any) -> None:
        if sociallogin.is_existing:
            self._roles(sociallogin)

    def save_user(self, request: HttpRequest, sociallogin: Any, form: Any = None) -> User:
        user: User = super().save_user(request, sociallogin, form)
        self._roles(sociallogin)
        return user

    @staticmethod
    def _roles(sociallogin: Any) -> None:
        if not settings.TOOLGATE_OIDC_ROLES:
            # No mapping (a provider without groups): an administrator gives the roles here.
            return
        claims = sociallogin.account.extra_data or {}
        if isinstance(claims.get("userinfo"), dict):
            claims = {**claims.get("id_token", {}), **claims["userinfo"]}
        roles = roles_from_claims(
            claims, settings.TOOLGATE_OIDC_ROLES, settings.TOOLGATE_OIDC_GROUPS_CLAIM
        )
        user_roles_set(sociallogin.user, roles)


class ProviderDownMiddleware:
    """The provider cannot be reached (its discovery document, its token endpoint): a page that
    says so, and that local accounts may still log in, not a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/accounts/oidc/"):
            return None
        if not isinstance(exception, requests.RequestException):
            return None
        logger.warning("The identity provider could not be reached: %s", exception)
        return render(request, "registration/provider_down.html", status=503)

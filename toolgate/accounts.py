"""django-allauth, as Toolgate uses it: for the second factor's pages (enrolment, recovery codes,
re-authentication), never to open an account."""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from django.http import HttpRequest


class ClosedSignupAdapter(DefaultAccountAdapter):  # type: ignore[misc]
    """Accounts are made by an administrator: nobody signs up."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False

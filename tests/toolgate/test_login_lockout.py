"""Logins are throttled: repeated failures lock a user name and client address out for a while.

Axes counts failures in the database (so every web process sees them); the client address comes
from dispatch.client_address, which believes X-Forwarded-For only behind trusted proxies.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client
from pytest_django.fixtures import Settings

if TYPE_CHECKING:
    # The test client's response, as django-stubs names it (it has no name at run time).
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

pytestmark = pytest.mark.django_db

PASSWORD = "right-horse-battery"
LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"


@pytest.fixture
def reviewer() -> User:
    return User.objects.create_user("reviewer", password=PASSWORD)


def log_in(client: Client, password: str, *, path: str = LOGIN, **extra: Any) -> Response:
    return client.post(path, {"username": "reviewer", "password": password, "next": "/"}, **extra)


def fail(client: Client, times: int, *, path: str = LOGIN, **extra: Any) -> None:
    for attempt in range(times):
        log_in(client, f"wrong-{attempt}", path=path, **extra)


def logged_in(client: Client) -> bool:
    return bool(get_user(client).is_authenticated)


def assert_locked_out(response: Response) -> None:
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert b"Wait 15 minutes" in response.content
    assert int(response["Retry-After"]) == 15 * 60


def age_attempts(minutes: int) -> None:
    """Make every recorded failure that many minutes older, as if the time had passed."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=minutes))


def test_it_refuses_the_right_password_after_25_wrong_ones(client: Client, reviewer: User) -> None:
    fail(client, 25)

    response = log_in(client, PASSWORD)

    assert_locked_out(response)
    assert b"After 5 failed attempts" in response.content
    assert not logged_in(client)


def test_the_right_password_still_works_after_fewer_failures_than_the_limit(
    client: Client, reviewer: User
) -> None:
    fail(client, 4)

    response = log_in(client, PASSWORD)

    assert response.status_code == 302
    assert logged_in(client)
    # A successful login clears the count, so four more failures do not lock either.
    client.logout()
    fail(client, 4)
    assert log_in(client, PASSWORD).status_code == 302


def test_another_address_or_user_name_is_not_locked(client: Client, reviewer: User) -> None:
    User.objects.create_user("manager", password=PASSWORD)
    fail(client, 25)

    response = log_in(client, PASSWORD, REMOTE_ADDR="198.51.100.7")

    assert response.status_code == 302
    assert logged_in(client)
    client.logout()
    other_user = client.post(LOGIN, {"username": "manager", "password": PASSWORD})
    assert other_user.status_code == 302
    assert_locked_out(log_in(client, PASSWORD))


def test_it_lets_the_user_in_again_after_the_cool_off(client: Client, reviewer: User) -> None:
    fail(client, 5)
    age_attempts(14)
    # Still within the cool-off; this attempt also starts the cool-off again.
    assert_locked_out(log_in(client, PASSWORD))

    age_attempts(16)
    response = log_in(client, PASSWORD)

    assert response.status_code == 302
    assert logged_in(client)
    assert not AccessAttempt.objects.filter(failures_since_start__gt=0).exists()


def test_the_limit_and_the_cool_off_come_from_the_settings(
    client: Client, reviewer: User, settings: Settings
) -> None:
    settings.AXES_FAILURE_LIMIT = 2
    settings.AXES_COOLOFF_TIME = timedelta(minutes=1)
    fail(client, 2)

    response = log_in(client, PASSWORD)

    assert response.status_code == 429
    assert b"Wait 1 minute without" in response.content
    assert response["Retry-After"] == "60"
    assert not logged_in(client)


def test_the_admin_login_is_locked_out_too(client: Client) -> None:
    User.objects.create_superuser("reviewer", password=PASSWORD)
    fail(client, 25, path=ADMIN_LOGIN)

    response = log_in(client, PASSWORD, path=ADMIN_LOGIN)

    assert_locked_out(response)
    assert not logged_in(client)
    assert client.get("/admin/").status_code == 302
    # One count for both pages: the site's login is locked for the same pair.
    assert_locked_out(log_in(client, PASSWORD))


def test_without_a_trusted_proxy_a_forwarded_address_is_ignored(
    client: Client, reviewer: User
) -> None:
    for attempt in range(25):
        log_in(client, f"wrong-{attempt}", HTTP_X_FORWARDED_FOR=f"203.0.113.{attempt}")

    response = log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.200")

    assert_locked_out(response)
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.1"]


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_one_locked(
    client: Client, reviewer: User, settings: Settings
) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 1
    # The proxy is the socket's peer (127.0.0.1); it appends the client's address to whatever
    # the client sent, which an attacker varies to look like many clients.
    for attempt in range(25):
        log_in(client, f"wrong-{attempt}", HTTP_X_FORWARDED_FOR=f"10.9.9.{attempt}, 203.0.113.9")

    locked = log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.9")
    elsewhere = log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.10")

    assert_locked_out(locked)
    assert elsewhere.status_code == 302
    assert logged_in(client)
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["203.0.113.9"]


def test_a_failure_says_how_many_attempts_are_left_before_the_lockout(
    client: Client, reviewer: User
) -> None:
    words = [log_in(client, f"wrong-{n}").content.decode() for n in range(4)]

    assert "4 attempts left" in words[0]
    assert "3 attempts left" in words[1]
    assert "1 attempt left" in words[3]
    # The fifth failure locks out: the lockout page says so instead.
    assert_locked_out(log_in(client, "wrong-5"))


def test_the_warning_is_the_same_for_a_user_name_that_does_not_exist(
    client: Client, reviewer: User
) -> None:
    known = log_in(client, "wrong").content.decode()
    unknown = client.post(
        LOGIN, {"username": "nobody-here", "password": "wrong", "next": "/"}
    ).content.decode()

    def without_token_and_name(page: str, name: str) -> str:
        page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", page)
        return page.replace(name, "NAME")

    assert "4 attempts left" in known and "4 attempts left" in unknown
    # Nothing else differs either: the page does not tell whether the user exists.
    assert without_token_and_name(known, "reviewer") == without_token_and_name(
        unknown, "nobody-here"
    )

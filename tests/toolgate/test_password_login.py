"""Local passwords may be switched off when single sign-on is on (TOOLGATE_PASSWORD_LOGIN,
docs/identity.md): then only the local administrators listed in TOOLGATE_PASSWORD_LOGIN_USERS log
in with a password, on the site's login and the admin's alike."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

pytestmark = pytest.mark.django_db

PASSWORD = "right-horse-battery"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def passwords_off(settings: Settings) -> None:
    settings.TOOLGATE_OIDC_SERVER_URL = "http://127.0.0.1:9/"
    settings.TOOLGATE_OIDC_NAME = "Company SSO"
    settings.TOOLGATE_PASSWORD_LOGIN = False
    settings.TOOLGATE_PASSWORD_LOGIN_USERS = ["ada"]


def log_in(client: Client, username: str, path: str) -> bool:
    client.post(path, {"username": username, "password": PASSWORD, "next": "/"})
    return bool(get_user(client).is_authenticated)


@pytest.mark.usefixtures("passwords_off")
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_with_passwords_off_only_the_listed_local_administrators_log_in_with_one(
    path: str,
) -> None:
    User.objects.create_user("ada", password=PASSWORD, is_staff=True, is_superuser=True)
    User.objects.create_user("rita", password=PASSWORD, is_staff=True)

    assert log_in(Client(), "ada", path)
    assert not log_in(Client(), "rita", path)


@pytest.mark.usefixtures("passwords_off")
def test_the_login_page_says_passwords_are_for_local_administrators(client: Client) -> None:
    page = client.get("/accounts/login/").content.decode()

    assert "Log in with Company SSO: passwords here are for the local administrators" in page


def test_passwords_are_on_by_default_outside_production(settings: Settings) -> None:
    User.objects.create_user("rita", password=PASSWORD)

    assert settings.TOOLGATE_PASSWORD_LOGIN
    assert log_in(Client(), "rita", "/accounts/login/")


@pytest.mark.parametrize(("sso", "expected"), [("https://sso.example.test", "False"), ("", "True")])
def test_in_production_passwords_are_off_when_single_sign_on_is_on(sso: str, expected: str) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "TOOLGATE_AUDIT_KEYS": f"1:{secrets.token_hex(32)}",
        "CACHE_URL": "redis://127.0.0.1:6379/1",
        "TOOLGATE_OIDC_SERVER_URL": sso,
    }
    env.pop("TOOLGATE_PASSWORD_LOGIN", None)
    code = "from django.conf import settings; print(settings.TOOLGATE_PASSWORD_LOGIN)"
    completed = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.stdout.strip().splitlines()[-1] == expected, completed.stderr

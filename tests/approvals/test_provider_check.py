"""A single sign-on reviewer's decisions need the provider's fresh word
(approvals/provider_check.py, docs/identity.md); the provider vouching at its own login may stand
for the second factor (approvals/factors.py). Against the real provider, in a browser:
tests/e2e/test_sso_browser.py."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount, SocialToken
from django.contrib.auth.models import User
from django.test import Client, RequestFactory
from django.utils import timezone
from pytest_django.fixtures import Settings

from approvals.factors import provider_factor_at
from approvals.models import ReviewerToken
from approvals.provider_check import provider_checked
from approvals.reviewers import reviewer_token_create
from dispatch.models import Agent, ConfirmationStatus, SecurityEvent
from tests.approvals.conftest import refund_held_for
from tests.approvals.test_apis import make_user, status_of
from tests.conftest import Ledger, MakeAgent
from tests.factories import OrderFactory
from toolgate.accounts import provider_login

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def provider_down(settings: Settings) -> None:
    """Single sign-on configured with a provider nobody answers for; every decision asks it."""
    settings.TOOLGATE_OIDC_SERVER_URL = server = dead_url()
    settings.TOOLGATE_OIDC_CHECK_SECONDS = 0
    settings.SOCIALACCOUNT_PROVIDERS = {
        "openid_connect": {
            "APPS": [
                {
                    "provider_id": "sso",
                    "name": "SSO",
                    "client_id": "toolgate",
                    "secret": "s",
                    "settings": {"server_url": server},
                }
            ]
        }
    }


def sso_user(username: str, **token: Any) -> User:
    """A reviewer who logged in with the provider, its access token kept."""
    user = make_user(username)
    user.set_unusable_password()
    user.save()
    account = SocialAccount.objects.create(user=user, provider="sso", uid=username)
    SocialToken.objects.create(account=account, token="access-" + username, **token)
    return user


def reject(client: Client, confirmation_id: str, token: str) -> Any:
    return client.post(
        f"/api/v1/confirmations/{confirmation_id}/reject",
        {"reason": "late"},
        content_type="application/json",
        headers={"Authorization": f"Token {token}"},
    )


@pytest.mark.usefixtures("provider_down")
def test_the_provider_down_decides_nothing_and_ends_nothing(
    make_agent: MakeAgent, client: Client
) -> None:
    confirmation = refund_held_for(make_agent()[0])
    rita = sso_user("rita")
    token = reviewer_token_create(user=rita)

    response = reject(client, str(confirmation.pk), token)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "provider_check_unavailable"
    assert status_of(confirmation) == ConfirmationStatus.PENDING
    assert ReviewerToken.objects.filter(user=rita).exists()


@pytest.mark.usefixtures("provider_down")
def test_local_reviewers_and_a_check_younger_than_the_limit_ask_no_provider(
    make_agent: MakeAgent, client: Client, settings: Settings
) -> None:
    OrderFactory.create(order_id="ORD-2001", customer_id="CUS-1", total_cents=50_000)
    agent = make_agent()[0]
    local = refund_held_for(agent)
    checked = refund_held_for(agent, order_id="ORD-2001", session="s-2")
    ada = make_user("ada")
    settings.TOOLGATE_OIDC_CHECK_SECONDS = 300
    rita = sso_user("rita")
    provider_checked(rita)

    assert reject(client, str(local.pk), reviewer_token_create(user=ada)).status_code == 200
    assert reject(client, str(checked.pk), reviewer_token_create(user=rita)).status_code == 200
    assert status_of(checked) == ConfirmationStatus.REJECTED


@pytest.mark.usefixtures("provider_down")
def test_an_expired_access_token_with_no_refresh_token_ends_access_until_the_next_login(
    make_agent: MakeAgent, client: Client
) -> None:
    confirmation = refund_held_for(make_agent()[0])
    rita = sso_user("rita", expires_at=timezone.now() - timedelta(seconds=1))
    token = reviewer_token_create(user=rita)

    gone = reject(client, str(confirmation.pk), token)
    again = reject(client, str(confirmation.pk), token)

    assert gone.status_code == 403
    assert gone.json()["error"]["code"] == "provider_user_gone"
    assert again.status_code == 401
    assert SecurityEvent.objects.filter(channel="api", reason="provider_user_gone").count() == 1
    assert not SocialToken.objects.filter(account__user=rita).exists()
    assert status_of(confirmation) == ConfirmationStatus.PENDING


def test_the_providers_second_factor_counts_while_its_auth_time_is_fresh(
    settings: Settings,
) -> None:
    settings.TOOLGATE_FACTOR_FRESH_SECONDS = 300
    settings.TOOLGATE_OIDC_FACTOR_ACR = ["urn:example:loa:2"]
    now = time.time()
    fresh = int(now) - 60

    assert provider_factor_at({"amr": ["pwd", "otp"], "auth_time": fresh}, now) == fresh
    assert provider_factor_at({"acr": "urn:example:loa:2", "auth_time": fresh}, now) == fresh
    # A password alone, an acr not mapped, no auth_time, a stale one, one from the future.
    assert provider_factor_at({"amr": ["pwd"], "auth_time": fresh}, now) is None
    assert provider_factor_at({"acr": "urn:example:loa:1", "auth_time": fresh}, now) is None
    assert provider_factor_at({"amr": ["mfa"]}, now) is None
    assert provider_factor_at({"amr": "mfa", "auth_time": fresh}, now) is None
    assert provider_factor_at({"amr": ["mfa"], "auth_time": int(now) - 301}, now) is None
    assert provider_factor_at({"amr": ["mfa"], "auth_time": int(now) + 3600}, now) is None
    assert provider_factor_at({"amr": ["mfa"], "auth_time": True}, now) is None


@pytest.fixture
def strict(make_agent: MakeAgent) -> Agent:
    """Above 80.00 an approval needs a second factor."""
    return make_agent(factor_above_cents=8_000)[0]


def logged_in_with_provider(user: User, id_token: dict[str, Any]) -> Client:
    """A browser whose login was the provider's, its ID token's claims as allauth verified them."""
    browser = Client()
    browser.force_login(user)
    request = RequestFactory().get("/")
    request.session = browser.session
    provider_login(request, user, {"id_token": id_token})
    request.session.save()
    return browser


def test_a_provider_login_with_a_second_factor_approves_above_the_line_without_totp(
    strict: Agent, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_000)
    rita = sso_user("rita")
    browser = logged_in_with_provider(rita, {"amr": ["pwd", "mfa"], "auth_time": int(time.time())})

    response = browser.post(f"/approvals/{confirmation.pk}/approve")

    assert response.status_code == 303
    assert status_of(confirmation) == ConfirmationStatus.EXECUTED
    assert ledger.state() == (1, 9_000)


def test_a_provider_login_with_a_password_alone_or_long_ago_still_asks_for_the_factor(
    strict: Agent, ledger: Ledger
) -> None:
    confirmation = refund_held_for(strict, 9_000)
    rita, otto = sso_user("rita"), sso_user("otto")
    now = int(time.time())
    password_only = logged_in_with_provider(rita, {"amr": ["pwd"], "auth_time": now})
    long_ago = logged_in_with_provider(otto, {"amr": ["mfa"], "auth_time": now - 3600})

    assert password_only.post(f"/approvals/{confirmation.pk}/approve").status_code == 403
    assert long_ago.post(f"/approvals/{confirmation.pk}/approve").status_code == 403
    assert status_of(confirmation) == ConfirmationStatus.PENDING
    assert ledger.state() == (0, 0)

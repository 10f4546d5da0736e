"""Single sign-on in a real browser, against a real OpenID provider started here (oidc-provider on
Node, tests/toolgate/oidc/): a user of the provider logs in with it, gets an account and the role
its groups map to, and lands on that role's page; the provider down is a clear page, and the
local login still works."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import requests
from allauth.socialaccount.models import SocialApp, SocialToken
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from approvals.models import ReviewerToken
from approvals.provider_check import ProviderUserGone, provider_check
from approvals.reviewers import reviewer_token_create
from dispatch.models import ConfirmationStatus, SecurityEvent
from orders.models import Order
from tests.approvals.conftest import refund_held_for
from tests.conftest import Ledger, MakeAgent, require_service
from tests.e2e.conftest import MakeBrowserUser, OpenTab, Tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROVIDER = Path(__file__).parent.parent / "toolgate" / "oidc"
CLIENT_ID, CLIENT_SECRET = "toolgate", "toolgate-test-secret"
GROUPS = {"rita": ["toolgate-reviewers", "sales"], "otto": ["sales"]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def removed_at_provider(tmp_path: Path) -> Path:
    """The file the provider reads its removed users from: a JSON list of their names."""
    return tmp_path / "removed.json"


@pytest.fixture
def provider(live_server: LiveServer, removed_at_provider: Path) -> Iterator[str]:
    """The provider's issuer URL, its client's redirect URI this live server's callback."""
    npm, node = shutil.which("npm"), shutil.which("node")
    require_service(npm is not None and node is not None, "needs Node.js and npm")
    assert npm is not None and node is not None
    if not (PROVIDER / "node_modules" / ".package-lock.json").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=PROVIDER,
            check=True,
            timeout=600,
        )
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [node, "provider.mjs"],
        cwd=PROVIDER,
        env={
            **os.environ,
            "PORT": str(port),
            "REDIRECT_URI": f"{live_server.url}/accounts/oidc/sso/login/callback/",
            "GROUPS": json.dumps(GROUPS),
            "REMOVED": str(removed_at_provider),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"{issuer}/.well-known/openid-configuration", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "the OpenID provider did not start"
                time.sleep(0.2)
        yield issuer
    finally:
        server.terminate()
        server.wait(timeout=10)


def forgive_the_providers_pages(tab: Tab, issuer: str) -> None:
    """The provider's own development pages load a web font and a favicon it does not serve:
    its errors, not this site's."""
    tab.errors = [
        error
        for error in tab.errors
        if not error.startswith((issuer, "https://fonts.googleapis.com/"))
    ]


def configure(settings: Settings, issuer: str) -> None:
    settings.TOOLGATE_OIDC_SERVER_URL = issuer
    settings.TOOLGATE_OIDC_NAME = "Company SSO"
    settings.TOOLGATE_OIDC_ROLES = {"reviewers": "toolgate-reviewers", "managers": "ops-leads"}
    settings.SOCIALACCOUNT_PROVIDERS = {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": "sso",
                    "name": "Company SSO",
                    "client_id": CLIENT_ID,
                    "secret": CLIENT_SECRET,
                    "settings": {
                        "server_url": issuer,
                        "scope": ["openid", "profile", "email", "groups"],
                    },
                }
            ],
        }
    }


def test_a_provider_user_logs_in_and_gets_the_role_its_groups_map_to(
    open_tab: OpenTab, provider: str, settings: Settings
) -> None:
    configure(settings, provider)
    tab = open_tab()
    page = tab.page

    page.goto("/accounts/login/")
    tab.check_accessibility()
    page.get_by_role("button", name="Log in with Company SSO").click()
    page.locator("input[name=login]").fill("rita")
    page.locator("input[name=password]").fill("anything")
    page.locator("button[type=submit]").click()
    page.locator("button[type=submit]").click()

    expect(page).to_have_url(re.compile(r"/approvals/$"))
    expect(page.get_by_role("navigation", name="Main")).to_contain_text("Approvals")
    forgive_the_providers_pages(tab, provider)
    rita = User.objects.get(username="rita")
    assert list(rita.groups.values_list("name", flat=True)) == ["reviewers"]
    assert not rita.has_usable_password()


def test_a_provider_user_in_no_mapped_group_gets_an_account_and_no_role(
    open_tab: OpenTab, provider: str, settings: Settings, browser_user: MakeBrowserUser
) -> None:
    configure(settings, provider)
    tab = open_tab()
    page = tab.page

    page.goto("/accounts/login/")
    page.get_by_role("button", name="Log in with Company SSO").click()
    page.locator("input[name=login]").fill("otto")
    page.locator("input[name=password]").fill("anything")
    page.locator("button[type=submit]").click()
    page.locator("button[type=submit]").click()

    expect(page.get_by_role("navigation", name="Main")).not_to_contain_text("Approvals")
    forgive_the_providers_pages(tab, provider)
    otto = User.objects.get(username="otto")
    assert not otto.groups.exists()
    assert not (otto.is_staff or otto.is_superuser)


def test_the_provider_down_is_a_clear_page_and_local_logins_still_work(
    open_tab: OpenTab, settings: Settings, browser_user: MakeBrowserUser
) -> None:
    configure(settings, f"http://127.0.0.1:{free_port()}")
    browser_user("ada", is_staff=True, is_superuser=True)
    tab = open_tab()
    page = tab.page

    page.goto("/accounts/login/")
    with page.expect_response(lambda response: "/accounts/oidc/" in response.url) as answer:
        page.get_by_role("button", name="Log in with Company SSO").click()

    assert answer.value.status == 503
    expect(page.get_by_role("heading", name="Single sign-on is unavailable")).to_be_visible()
    tab.check_accessibility()
    tab.errors.clear()
    page.get_by_role("link", name="log in with their password").click()
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("browser-pw")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page).to_have_url(re.compile(r"/admin/$"))


def sso_login(page: Page, username: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_role("button", name="Log in with Company SSO").click()
    page.locator("input[name=login]").fill(username)
    page.locator("input[name=password]").fill("anything")
    page.locator("button[type=submit]").click()
    page.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/approvals/$"))


def test_a_user_removed_at_the_provider_moves_no_money_and_loses_their_session_and_token(
    open_tab: OpenTab,
    provider: str,
    removed_at_provider: Path,
    settings: Settings,
    make_agent: MakeAgent,
    orders: dict[str, Order],
    ledger: Ledger,
    live_server: LiveServer,
) -> None:
    configure(settings, provider)
    confirmation = refund_held_for(make_agent()[0], 6_000)
    tab = open_tab()
    page = tab.page
    sso_login(page, "rita")
    forgive_the_providers_pages(tab, provider)
    rita = User.objects.get(username="rita")
    token = reviewer_token_create(user=rita)

    removed_at_provider.write_text(json.dumps(["rita"]))
    # Her login is the provider's word, younger than TOOLGATE_OIDC_CHECK_SECONDS: not asked.
    provider_check(rita)
    assert ReviewerToken.objects.filter(user=rita).exists()
    # Older than it: the next decision asks the provider.
    settings.TOOLGATE_OIDC_CHECK_SECONDS = 0
    page.goto(f"/approvals/{confirmation.pk}/")
    page.get_by_role("button", name=re.compile("^Approve")).first.click()

    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    expect(page.get_by_role("alert")).to_contain_text("no longer confirms your access")
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert SecurityEvent.objects.filter(reason="provider_user_gone", status=403).count() == 1
    page.goto(f"/approvals/{confirmation.pk}/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    assert not ReviewerToken.objects.filter(user=rita).exists()
    answer = requests.post(
        f"{live_server.url}/api/v1/confirmations/{confirmation.pk}/reject",
        json={"reason": "late"},
        headers={"Authorization": f"Token {token}"},
        timeout=10,
    )
    assert answer.status_code == 401
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING


def test_a_replayed_callback_logs_nobody_in(
    open_tab: OpenTab, provider: str, settings: Settings
) -> None:
    configure(settings, provider)
    tab = open_tab()
    callbacks: list[str] = []
    tab.page.on(
        "request",
        lambda request: (
            callbacks.append(request.url) if "/login/callback/" in request.url else None
        ),
    )
    sso_login(tab.page, "rita")
    forgive_the_providers_pages(tab, provider)
    assert len(callbacks) == 1

    # The same code and state, from another browser: its session holds no such state.
    other = open_tab()
    other.page.goto(callbacks[0])
    expect(other.page.get_by_role("heading", name="Third-Party Login Failure")).to_be_visible()
    other.page.goto("/approvals/")
    expect(other.page).to_have_url(re.compile(r"/accounts/login/"))
    other.errors.clear()


def test_a_forged_expired_or_misaddressed_id_token_is_refused(provider: str) -> None:
    adapter = OpenIDConnectOAuth2Adapter(RequestFactory().get("/"), "sso")
    adapter._openid_config = requests.get(
        f"{provider}/.well-known/openid-configuration", timeout=5
    ).json()
    app = SocialApp(
        provider="openid_connect", provider_id="sso", client_id=CLIENT_ID, secret=CLIENT_SECRET
    )
    now = int(time.time())
    good = {"iss": provider, "aud": CLIENT_ID, "sub": "rita", "iat": now, "exp": now + 300}
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def signed(claims: dict[str, object]) -> str:
        return jwt.encode(claims, forger, algorithm="RS256", headers={"kid": "forged"})

    # Signed by a key the provider never published (the signature is checked wherever the
    # token did not come straight from the provider's token endpoint).
    adapter.did_fetch_access_token = False
    with pytest.raises(OAuth2Error):
        adapter._decode_id_token(app, signed(good))
    # From the token endpoint itself, the claims are still checked: expired, another client's,
    # another issuer's.
    adapter.did_fetch_access_token = True
    assert adapter._decode_id_token(app, signed(good))["sub"] == "rita"
    for bad in (
        {**good, "exp": now - 60},
        {**good, "aud": "another-client"},
        {**good, "iss": "http://127.0.0.1:1"},
    ):
        with pytest.raises(OAuth2Error):
            adapter._decode_id_token(app, signed(bad))


def test_an_expired_access_token_is_refreshed_until_the_provider_refuses_the_user(
    open_tab: OpenTab, provider: str, removed_at_provider: Path, settings: Settings
) -> None:
    configure(settings, provider)
    settings.TOOLGATE_OIDC_CHECK_SECONDS = 0
    tab = open_tab()
    sso_login(tab.page, "rita")
    forgive_the_providers_pages(tab, provider)
    rita = User.objects.get(username="rita")
    kept = SocialToken.objects.get(account__user=rita)
    assert kept.token_secret, "the provider gave a refresh token"
    SocialToken.objects.filter(pk=kept.pk).update(expires_at=timezone.now())

    provider_check(rita)

    refreshed = SocialToken.objects.get(pk=kept.pk)
    assert refreshed.token != kept.token
    assert refreshed.expires_at is not None and refreshed.expires_at > timezone.now()
    reviewer_token_create(user=rita)
    SocialToken.objects.filter(pk=kept.pk).update(expires_at=timezone.now())
    removed_at_provider.write_text(json.dumps(["rita"]))
    with pytest.raises(ProviderUserGone):
        provider_check(rita)
    assert not ReviewerToken.objects.filter(user=rita).exists()
    assert not SocialToken.objects.filter(account__user=rita).exists()

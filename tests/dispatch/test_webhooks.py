"""Webhook URLs: https, and a public address, unless the settings say otherwise.

No test here sends anything: hosts are IP literals or `localhost`, which resolve without a network.
"""

from __future__ import annotations

import pytest
from pytest_django.fixtures import Settings

from dispatch.models import Agent
from dispatch.webhooks import (
    WebhookUrlInvalid,
    agent_webhook_secret_rotate,
    agent_webhook_set,
    webhook_target,
)
from tests.conftest import MakeAgent

# A public address (a documentation range would count as reserved).
PUBLIC = "https://93.184.215.14/hooks/toolgate?v=1"


def test_it_accepts_an_https_url_of_a_public_address() -> None:
    target = webhook_target(PUBLIC)

    assert (target.scheme, target.host, target.port) == ("https", "93.184.215.14", 443)
    assert target.target == "/hooks/toolgate?v=1"
    assert target.address == "93.184.215.14"


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://localhost:8443/hook",
        "https://[::1]/hook",
        "https://10.1.2.3/hook",
        "https://172.16.0.9/hook",
        "https://192.168.1.10/hook",
        "https://169.254.169.254/latest/meta-data/",
        "https://[fe80::1]/hook",
        "https://[fd00::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://100.64.0.1/hook",
        "https://0.0.0.0/hook",
        "https://240.0.0.1/hook",
        "https://192.0.2.10/hook",
        "https://224.0.0.1/hook",
    ],
)
def test_it_refuses_loopback_private_link_local_and_reserved_addresses(url: str) -> None:
    with pytest.raises(WebhookUrlInvalid, match="not a public address"):
        webhook_target(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://93.184.215.14/hook", "must be https"),
        ("ftp://93.184.215.14/hook", "must be https"),
        ("93.184.215.14/hook", "must be https"),
        ("https://user:pw@93.184.215.14/hook", "user name or password"),
        ("https://93.184.215.14/hook#part", "fragment"),
        ("https:///hook", "no host"),
        ("https://93.184.215.14:99999/hook", "malformed"),
        ("https://93.184.215.14:0/hook", "port"),
        ("https://exämple.com/hook", "ASCII"),
        ("https://93.184.215.14/ hook", "ASCII"),
        ("https://no-such-host.invalid/hook", "does not resolve"),
        ("https://93.184.215.14/" + "a" * 500, "too long"),
    ],
)
def test_it_refuses_malformed_urls_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(WebhookUrlInvalid, match=reason):
        webhook_target(url)


def test_it_accepts_http_and_private_addresses_only_when_the_settings_allow(
    settings: Settings,
) -> None:
    settings.DEBUG = True
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = True

    target = webhook_target("http://127.0.0.1:18801/hook")

    assert (target.scheme, target.address, target.port) == ("http", "127.0.0.1", 18801)


@pytest.mark.django_db
def test_setting_a_webhook_makes_a_secret_once_and_removing_it_drops_the_secret(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()

    secret = agent_webhook_set(agent=agent, url=PUBLIC)
    again = agent_webhook_set(agent=agent, url=PUBLIC.replace("v=1", "v=2"))
    stored = Agent.objects.get(pk=agent.pk)
    removed = agent_webhook_set(agent=agent, url="")

    assert secret is not None and secret.startswith("whsec_") and len(secret) > 40
    assert again is None
    assert (stored.webhook_url, stored.webhook_secret) == (PUBLIC.replace("v=1", "v=2"), secret)
    assert removed is None
    assert Agent.objects.filter(pk=agent.pk, webhook_url="", webhook_secret="").exists()


@pytest.mark.django_db
def test_a_refused_url_changes_nothing(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    agent_webhook_set(agent=agent, url=PUBLIC)

    with pytest.raises(WebhookUrlInvalid):
        agent_webhook_set(agent=agent, url="https://10.0.0.1/hook")

    assert Agent.objects.get(pk=agent.pk).webhook_url == PUBLIC


@pytest.mark.django_db
def test_rotating_the_secret_replaces_it(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    first = agent_webhook_set(agent=agent, url=PUBLIC)

    second = agent_webhook_secret_rotate(agent=agent)

    assert second != first
    assert Agent.objects.get(pk=agent.pk).webhook_secret == second


@pytest.mark.django_db
def test_an_agent_without_a_webhook_has_no_secret_to_rotate(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    with pytest.raises(WebhookUrlInvalid, match="has no webhook"):
        agent_webhook_secret_rotate(agent=agent)

    assert Agent.objects.get(pk=agent.pk).webhook_secret == ""

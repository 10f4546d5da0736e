"""Webhook URLs: https, and a public address, unless the settings say otherwise.

No test here sends anything: hosts are IP literals or `localhost`, which resolve without a network.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from dispatch.models import Agent
from dispatch.webhooks import (
    WebhookUrlInvalid,
    agent_webhook_secret_rotate,
    agent_webhook_set,
    embedded_ipv4,
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


# IPv6 addresses that carry an IPv4 address are judged as that address ---------------------------

EMBEDDED = {
    "loopback": "127.0.0.1",
    "private": "10.1.2.3",
    "link-local (metadata)": "169.254.169.254",
    "public": "93.184.215.14",
}
# Another public address, for the Teredo half that is not under test.
OTHER_PUBLIC = ipaddress.IPv4Address("8.8.8.8")


def _teredo(server: ipaddress.IPv4Address, client: ipaddress.IPv4Address) -> str:
    # 2001:0000:<server>:<flags>:<port, inverted>:<client, inverted>
    value = (0x2001_0000 << 96) | (int(server) << 64) | (0xFFFF_FFFF ^ int(client))
    return str(ipaddress.IPv6Address(value))


FORMS: dict[str, Callable[[ipaddress.IPv4Address], str]] = {
    "mapped ::ffff:0:0/96": lambda v4: str(ipaddress.IPv6Address(f"::ffff:{v4}")),
    "compatible ::/96": lambda v4: str(ipaddress.IPv6Address(int(v4))),
    "translated ::ffff:0:0:0/96": lambda v4: str(ipaddress.IPv6Address(f"::ffff:0:{v4}")),
    "NAT64 64:ff9b::/96": lambda v4: str(ipaddress.IPv6Address(f"64:ff9b::{v4}")),
    "6to4 2002::/16": lambda v4: str(ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80) | 1)),
    "Teredo client": lambda v4: _teredo(OTHER_PUBLIC, v4),
    "Teredo server": lambda v4: _teredo(v4, OTHER_PUBLIC),
}

EMBEDDING_CASES = [
    pytest.param(form(ipaddress.IPv4Address(v4)), kind == "public", id=f"{name}-{kind}")
    for name, form in FORMS.items()
    for kind, v4 in EMBEDDED.items()
]


@pytest.mark.parametrize(("address", "accepted"), EMBEDDING_CASES)
def test_an_ipv6_literal_carrying_an_ipv4_address_is_judged_as_that_address(
    address: str, accepted: bool
) -> None:
    url = f"https://[{address}]/hook"

    if accepted:
        assert webhook_target(url).address == address
    else:
        with pytest.raises(WebhookUrlInvalid, match="not a public address"):
            webhook_target(url)


@pytest.mark.parametrize(
    "address",
    [
        # The four, as written.
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
        # A network's own NAT64 prefix: where the IPv4 address sits is the network's choice.
        "64:ff9b:1::5db8:d70e",
        "64:ff9b:1:5db8:d7:e00::",
    ],
)
def test_it_refuses_the_known_forms_and_any_local_use_nat64_address(address: str) -> None:
    with pytest.raises(WebhookUrlInvalid, match="not a public address"):
        webhook_target(f"https://[{address}]/hook")


@pytest.mark.parametrize(("address", "accepted"), EMBEDDING_CASES)
def test_a_name_resolving_to_an_ipv6_address_carrying_an_ipv4_one_is_judged_the_same(
    address: str, accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS is not ours: the name resolves to the address under test.
    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        assert host == "hooks.example.com"
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    url = "https://hooks.example.com/hook"

    if accepted:
        assert webhook_target(url).address == address
    else:
        with pytest.raises(WebhookUrlInvalid, match="not a public address"):
            webhook_target(url)


def test_the_embedded_addresses_are_read_from_the_right_bits() -> None:
    v4 = ipaddress.IPv4Address

    found = {
        form: embedded_ipv4(ipaddress.IPv6Address(address))
        for form, address in {
            "mapped": "::ffff:169.254.169.254",
            "compatible": "::169.254.169.254",
            "translated": "::ffff:0:169.254.169.254",
            "NAT64": "64:ff9b::a9fe:a9fe",
            "6to4": "2002:a9fe:a9fe:1:2:3:4:5",
            "Teredo": "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "native": "2606:4700::1111",
        }.items()
    }

    assert found == {
        "mapped": (v4("169.254.169.254"),),
        "compatible": (v4("169.254.169.254"),),
        "translated": (v4("169.254.169.254"),),
        "NAT64": (v4("169.254.169.254"),),
        "6to4": (v4("169.254.169.254"),),
        # RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (stored inverted).
        "Teredo": (v4("65.54.227.120"), v4("192.0.2.45")),
        "native": None,
    }

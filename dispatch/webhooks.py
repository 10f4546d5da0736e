"""An agent's webhook: where decisions and results of its confirmations are sent, and the secret
that signs them (approvals.webhooks sends them).

A webhook URL makes this server send requests where an agent host says: to a cloud's metadata
address or a database on the private network if nothing stopped it. So a URL is https (http only
under DEBUG), names no credentials, and every address its host resolves to must be public (an
IPv6 address that carries an IPv4 one, such as 64:ff9b::a9fe:a9fe, is judged as the IPv4 one),
unless TOOLGATE_WEBHOOK_ALLOW_PRIVATE says otherwise. The same check runs again before each
delivery, which then connects to the address it checked (a name may resolve elsewhere by then).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from dispatch.models import Agent

SECRET_PREFIX = "whsec_"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookUrlInvalid(ValueError):
    """The URL may not receive webhooks; the message says why, for the operator."""


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """A checked URL: its parts, and the address a delivery connects to."""

    url: str
    scheme: str
    host: str
    port: int
    # The path with its query, as sent in the request line.
    target: str
    address: str


def _private_allowed() -> bool:
    return bool(settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE)


# IPv6 forms whose last 32 bits are an IPv4 address that the packets end up at: IPv4-compatible
# (deprecated, ::/96), IPv4-translated (SIIT, ::ffff:0:0:0/96) and NAT64's well-known prefix.
_LAST_32_BITS = tuple(
    ipaddress.IPv6Network(network) for network in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96")
)
# NAT64 prefixes a network chooses itself (RFC 8215): where the IPv4 address sits depends on a
# prefix length only that network knows, so nothing inside can be judged.
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...] | None:
    """The IPv4 addresses an IPv6 address carries and stands for, or None if it carries none:
    IPv4-mapped, -compatible, -translated, NAT64 (64:ff9b::/96), 6to4 (the address in bits 16 to
    48) and Teredo (the server, and the client, stored inverted)."""
    if address.ipv4_mapped is not None:
        return (address.ipv4_mapped,)
    if any(address in network for network in _LAST_32_BITS):
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address in _SIX_TO_FOUR and address.sixtofour is not None:
        return (address.sixtofour,)
    if address in _TEREDO and address.teredo is not None:
        return address.teredo
    return None


def _is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        # ::127.0.0.1, 64:ff9b::a9fe:a9fe or 2002:7f00:1:: reach what they embed, and Python's
        # own tables call some of them global: each is judged as the IPv4 address inside.
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return all(_is_public(inner) for inner in embedded)
        if address in _NAT64_LOCAL_USE:
            return False
    # is_global leaves out loopback, private, link-local, shared (100.64/10), reserved and
    # documentation ranges; multicast is not a host.
    return address.is_global and not address.is_multicast


def _described(address: IPAddress) -> str:
    embedded = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    if embedded is None:
        return str(address)
    return f"{address} (carrying {' and '.join(str(inner) for inner in embedded)})"


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise WebhookUrlInvalid(f"The host {host!r} does not resolve.") from None
    addresses: list[IPAddress] = []
    for info in infos:
        # The scope of a link-local IPv6 address (fe80::1%eth0) is not part of the address.
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise WebhookUrlInvalid(f"The host {host!r} does not resolve.")
    return addresses


def webhook_target(url: str) -> WebhookTarget:
    """Check a webhook URL and resolve its host; raises WebhookUrlInvalid."""
    if len(url) > (Agent._meta.get_field("webhook_url").max_length or 500):
        raise WebhookUrlInvalid("The URL is too long.")
    if not url.isascii() or any(character.isspace() for character in url):
        raise WebhookUrlInvalid("The URL must be ASCII without spaces (punycode for names).")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookUrlInvalid(f"The URL is malformed: {exc}.") from None
    allowed_schemes = {"https", "http"} if settings.DEBUG else {"https"}
    if parts.scheme not in allowed_schemes:
        raise WebhookUrlInvalid(
            "The URL must be https" + (" (or http under DEBUG)." if settings.DEBUG else ".")
        )
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlInvalid("The URL must not carry a user name or password.")
    if parts.fragment:
        raise WebhookUrlInvalid("The URL must not have a fragment (#...).")
    host = parts.hostname
    if not host:
        raise WebhookUrlInvalid("The URL has no host.")
    if port == 0:
        raise WebhookUrlInvalid("The URL's port must be 1 to 65535.")
    port = port or (443 if parts.scheme == "https" else 80)
    addresses = _resolve(host, port)
    if not _private_allowed():
        refused = [_described(address) for address in addresses if not _is_public(address)]
        if refused:
            raise WebhookUrlInvalid(
                f"The host {host!r} resolves to {', '.join(refused)}, which is not a public "
                "address (loopback, private, link-local or reserved). Webhooks go to public "
                "addresses only, unless TOOLGATE_WEBHOOK_ALLOW_PRIVATE is set."
            )
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return WebhookTarget(
        url=url,
        scheme=parts.scheme,
        host=host,
        port=port,
        target=target,
        address=str(addresses[0]),
    )


def webhook_secret_new() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


@transaction.atomic
def agent_webhook_set(*, agent: Agent, url: str) -> str | None:
    """Set (or, with an empty URL, remove) the agent's webhook; raises WebhookUrlInvalid.

    Returns a new secret when one was made (the agent had none), to be shown once; None when the
    agent keeps its secret or no longer has a webhook.
    """
    url = url.strip()
    if url:
        webhook_target(url)
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    new_secret = None
    if not url:
        locked.webhook_secret = ""
    elif not locked.webhook_secret:
        new_secret = locked.webhook_secret = webhook_secret_new()
    locked.webhook_url = url
    locked.save(update_fields=["webhook_url", "webhook_secret"])
    agent.webhook_url, agent.webhook_secret = locked.webhook_url, locked.webhook_secret
    return new_secret


@transaction.atomic
def agent_webhook_secret_rotate(*, agent: Agent) -> str:
    """A new secret for an agent that has a webhook, to be shown once; the old one stops working
    at once. Raises WebhookUrlInvalid if the agent has no webhook."""
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    if not locked.webhook_url:
        raise WebhookUrlInvalid(f"The agent {locked.name!r} has no webhook.")
    locked.webhook_secret = webhook_secret_new()
    locked.save(update_fields=["webhook_secret"])
    agent.webhook_secret = locked.webhook_secret
    return locked.webhook_secret

"""The address a request came from, as far as this deployment can trust it.

Behind proxies the socket's peer is the last proxy, and the client is named in X-Forwarded-For,
to which each proxy appends the address it was connected from. Only the entries the trusted
proxies appended can be believed: anything to their left was sent by the client and may be
forged. So with TOOLGATE_TRUSTED_PROXY_COUNT = n the client is the n-th entry from the right
(nginx alone: the right-most), and with 0 (the default) the header is ignored.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    """The client's IP address, or "" when the request has none (a request made in code)."""
    return forwarded_client_address(
        request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR", "")
    )


def forwarded_client_address(peer_address: str, forwarded_for: str) -> str:
    """The same, from the socket's peer and the X-Forwarded-For header, for a request that is not
    Django's (the MCP server's, on ASGI)."""
    peer = _normalised(peer_address) or ""
    trusted = int(settings.TOOLGATE_TRUSTED_PROXY_COUNT)
    if trusted <= 0:
        return peer
    forwarded = [entry.strip() for entry in forwarded_for.split(",") if entry.strip()]
    # Fewer entries than proxies means the request did not pass through all of them (it reached
    # the app directly, say), so none of the header can be trusted; the peer is what is known.
    if len(forwarded) < trusted:
        return peer
    return _normalised(forwarded[-trusted]) or peer


def _normalised(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address.strip()))
    except ValueError:
        return None

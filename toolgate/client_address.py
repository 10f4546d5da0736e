"""The address a request comes from: the one notion of it for whatever keys on the client
(security events, login lockout).

With no proxy (TOOLGATE_TRUSTED_PROXY_COUNT = 0, the default) it is the socket's REMOTE_ADDR;
X-Forwarded-For is then the client's own text and ignored. Behind N trusted proxies that each
append the address they received the request from, the client is the N-th entry from the right:
anything left of it was sent by the client and proves nothing.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address, normalised; None when what is there is not an address."""
    proxies = int(settings.TOOLGATE_TRUSTED_PROXY_COUNT)
    if proxies > 0:
        header = str(request.META.get("HTTP_X_FORWARDED_FOR", ""))
        forwarded = [entry.strip() for entry in header.split(",") if entry.strip()]
        if forwarded:
            # Fewer entries than proxies: all were appended by proxies, the first is the client.
            return _address(forwarded[-min(proxies, len(forwarded))])
    return _address(str(request.META.get("REMOTE_ADDR", "")))


def _address(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None

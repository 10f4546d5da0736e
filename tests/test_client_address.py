"""The client's address: the socket's unless trusted proxies say otherwise, and never what the
client wrote itself."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from pytest_django import Settings

from toolgate.client_address import client_address


def address(forwarded: str | None = None, *, remote: str = "10.0.0.2") -> str | None:
    meta = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_address(RequestFactory().get("/", **meta))  # type: ignore[arg-type]


def test_without_a_trusted_proxy_it_is_the_sockets_and_the_header_is_ignored(
    settings: Settings,
) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 0

    assert address("203.0.113.7") == "10.0.0.2"


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (1, "203.0.113.7", "203.0.113.7"),
        # The client wrote the first entry; the proxy appended the address it really saw.
        (1, "6.6.6.6, 203.0.113.7", "203.0.113.7"),
        (1, "6.6.6.6,203.0.113.7", "203.0.113.7"),
        (2, "6.6.6.6, 203.0.113.7, 10.0.0.1", "203.0.113.7"),
        # Fewer entries than proxies: every entry is a proxy's, the first is the client.
        (2, "203.0.113.7", "203.0.113.7"),
        (1, "2001:DB8::1", "2001:db8::1"),
    ],
)
def test_behind_trusted_proxies_it_is_the_entry_the_outermost_one_appended(
    settings: Settings, proxies: int, forwarded: str, expected: str
) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = proxies

    assert address(forwarded) == expected


def test_behind_a_proxy_a_request_without_the_header_is_the_sockets(settings: Settings) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 1

    assert address(None) == "10.0.0.2"


@pytest.mark.parametrize("forwarded", ["unknown", "203.0.113.7:5555", "<script>", "1.2.3"])
def test_an_entry_that_is_not_an_address_is_none(settings: Settings, forwarded: str) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 1

    assert address(f"6.6.6.6, {forwarded}") is None


def test_a_socket_without_an_address_is_none(settings: Settings) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 0

    assert address(remote="") is None

from __future__ import annotations

import pytest
from django.http import HttpRequest
from django.test import RequestFactory
from pytest_django.fixtures import Settings

from dispatch.client_address import client_address


def request_from(peer: str, forwarded: str | None = None) -> HttpRequest:
    request = RequestFactory().get("/", REMOTE_ADDR=peer)
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    return request


def test_without_trusted_proxies_it_is_the_socket_peer_whatever_the_header_says() -> None:
    request = request_from("198.51.100.1", "203.0.113.9")

    assert client_address(request) == "198.51.100.1"


@pytest.mark.parametrize(
    ("trusted", "forwarded", "expected"),
    [
        (1, "203.0.113.9", "203.0.113.9"),
        # What the client sent sits to the left of what the proxy appended.
        (1, "10.0.0.1, 192.0.2.1, 203.0.113.9", "203.0.113.9"),
        (2, "10.0.0.1, 203.0.113.9, 192.0.2.50", "203.0.113.9"),
        (1, " 2001:DB8::1 ", "2001:db8::1"),
    ],
)
def test_behind_trusted_proxies_it_is_the_right_most_untrusted_forwarded_entry(
    settings: Settings, trusted: int, forwarded: str, expected: str
) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = trusted

    assert client_address(request_from("127.0.0.1", forwarded)) == expected


@pytest.mark.parametrize("forwarded", ["", "203.0.113.9", "not-an-address, unknown"])
def test_a_header_the_proxies_did_not_write_falls_back_to_the_peer(
    settings: Settings, forwarded: str
) -> None:
    # Two proxies must have appended two entries; fewer, or garbage, was not written by them.
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 2

    assert client_address(request_from("127.0.0.1", forwarded)) == "127.0.0.1"


def test_a_request_without_an_address_has_an_empty_one() -> None:
    assert client_address(HttpRequest()) == ""

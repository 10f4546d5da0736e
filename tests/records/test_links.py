"""No link leads a user to a 403: from the home page, every link of the navigation and of the
pages it reaches opens for the user who sees it, whatever their role."""

from __future__ import annotations

import re
from collections import deque
from html import unescape
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.approvals.conftest import MakeUser
from tests.records.conftest import Books, as_user, refused

pytestmark = pytest.mark.django_db

# Pages read, at most, per role: enough to reach every kind of page from the navigation.
MOST_PAGES = 120
# Opened, not walked: the admin's own pages, the API and its docs.
NOT_WALKED = ("/admin/", "/api/")
# The links a user follows: anchors (stylesheets and the icon are the browser test's).
HREF = re.compile(r'<a\s[^>]*?href="([^"#]*)')


def walk(client: Client) -> dict[str, int]:
    """Every page reachable from the home page by links, with its status (GET)."""
    seen: dict[str, int] = {}
    todo = deque(["/"])
    while todo and len(seen) < MOST_PAGES:
        url = todo.popleft()
        if url in seen:
            continue
        response = client.get(url)
        seen[url] = response.status_code
        if response.status_code != 200 or url.startswith(NOT_WALKED):
            continue
        if "text/html" not in response.get("Content-Type", ""):
            continue
        for href in HREF.findall(response.content.decode()):
            link = unescape(href)
            if link.startswith("?"):
                link = urlsplit(url).path + link
            if not link.startswith("/") or link.startswith("//"):
                continue
            # Sorting and paging give the same links again.
            if re.search(r"[?&](sort|page)=", link):
                continue
            if link not in seen:
                todo.append(link)
    return seen


@pytest.mark.parametrize("role", ["reviewer", "manager", "manager and reviewer", "admin"])
def test_every_link_a_user_sees_opens(
    books: Books,
    make_user: MakeUser,
    reviewer: User,
    manager: User,
    role: str,
) -> None:
    refused(Client(), 2)
    users = {
        "reviewer": reviewer,
        "manager": manager,
        "manager and reviewer": make_user("mia", "managers", "reviewers"),
        "admin": make_user("ada", is_staff=True, is_superuser=True),
    }

    statuses = walk(as_user(users[role]))

    # Enrolling an authenticator app asks for the password again first (allauth's
    # re-authentication): a redirect, not a broken link.
    reauthenticated = {"/accounts/2fa/totp/activate/": 302} if role != "admin" else {}
    assert {url: status for url, status in statuses.items() if status != 200} == reauthenticated
    assert len(statuses) > (2 if role == "admin" else 8)
    walked = set(statuses)
    if role != "admin":
        assert not [url for url in walked if url.startswith("/admin/")], walked
    expected = {
        "reviewer": [
            "/approvals/",
            "/records/orders/ORD-1001/",
            "/analytics/sessions/",
            "/analytics/calls/",
        ],
        "manager": [
            "/analytics/calls/",
            "/records/confirmations/",
            "/records/security/",
            "/records/orders/ORD-1001/",
            "/analytics/sessions/",
        ],
        "manager and reviewer": ["/approvals/", "/records/security/", "/records/orders/"],
        "admin": ["/admin/"],
    }[role]
    for prefix in expected:
        assert any(url.startswith(prefix) for url in walked), (prefix, sorted(walked))

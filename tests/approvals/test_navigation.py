"""Each role's landing after the login, the places each user sees, and the time zone shown."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.utils import timezone

from approvals.templatetags.review import moment
from tests.approvals.conftest import HoldRefund, MakeUser
from tests.conftest import confirmation_rewrite

pytestmark = pytest.mark.django_db


def login(client: Client, username: str, **extra: str) -> str:
    response = client.post("/accounts/login/", {"username": username, "password": "pw", **extra})
    assert response.status_code == 302, response.content
    return str(response["Location"])


def nav_links(client: Client) -> list[str]:
    header = client.get("/").content.decode().split("<main", 1)[0]
    return re.findall(r'<a href="([^"]+)"', header)


def test_a_reviewer_lands_on_the_queue(client: Client, reviewer: User) -> None:
    assert login(client, "rita") == "/approvals/"


def test_a_manager_lands_on_the_dashboard_and_finds_the_records_at_home(
    client: Client, manager: User
) -> None:
    # A staff manager who may read the audit records in the admin still reads them on the site's
    # own pages: the admin is for configuration.
    manager.is_staff = True
    manager.save()
    manager.user_permissions.add(Permission.objects.get(codename="view_auditrecord"))

    landing = login(client, "max")

    assert landing == "/analytics/"
    home = client.get("/").content.decode()
    for place in (
        "/analytics/",
        "/analytics/calls/",
        "/records/confirmations/",
        "/records/security/",
        "/records/orders/",
    ):
        assert f'href="{place}"' in home
    assert "/admin/" not in home


def test_an_admin_lands_in_the_admin(client: Client, make_user: MakeUser) -> None:
    make_user("ada", is_staff=True, is_superuser=True)

    assert login(client, "ada") == "/admin/"


def test_the_login_still_honours_next(client: Client, reviewer: User) -> None:
    assert login(client, "rita", next="/approvals/history/") == "/approvals/history/"


def test_each_user_sees_only_their_places(
    client: Client, reviewer: User, manager: User, make_user: MakeUser
) -> None:
    managers = Group.objects.get(name="managers")
    managers.permissions.add(Permission.objects.get(codename="view_auditrecord"))
    make_user("nobody")

    client.force_login(reviewer)
    as_reviewer = nav_links(client)
    client.force_login(manager)
    as_manager = nav_links(client)
    client.force_login(User.objects.get(username="nobody"))
    as_nobody = nav_links(client)
    nobody_home = client.get("/").content.decode()

    assert "/approvals/" in as_reviewer and "/admin/" not in as_reviewer
    assert "/records/orders/" in as_reviewer and "/records/confirmations/" not in as_reviewer
    assert "/analytics/calls/" in as_manager and "/approvals/" not in as_manager
    assert "/admin/" not in "".join(as_manager)
    assert not [link for link in as_nobody if link.startswith(("/approvals/", "/admin/"))]
    assert "There is nothing here for you yet" in nobody_home


def test_times_are_shown_in_the_zone_the_browser_reported(
    client: Client, reviewer: User, hold_refund: HoldRefund
) -> None:
    held = hold_refund()
    created = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
    confirmation_rewrite(held.pk, created_at=created)
    client.force_login(reviewer)
    client.cookies["tz"] = "America/Sao_Paulo"

    page = client.get(f"/approvals/{held.pk}/").content.decode()

    assert "2026-01-15 09:00:00 -03" in page
    assert "Times are shown in America/Sao_Paulo" in page


def test_a_zone_that_is_not_a_zone_name_falls_back_to_utc(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)
    client.cookies["tz"] = "../../../etc/passwd"

    page = client.get("/approvals/").content.decode()

    assert "Times are shown in UTC" in page


def test_a_relative_time_carries_the_exact_time_on_hover() -> None:
    soon = timezone.now() + timedelta(minutes=30, seconds=5)

    shown = moment(soon)

    assert ">in 30\xa0minutes<" in shown
    assert f'datetime="{soon.isoformat()}"' in shown
    assert re.search(r'title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"', shown)

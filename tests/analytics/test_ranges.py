"""What a reader types, read in a time zone: the pages read it in the reader's, the API in UTC."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from analytics.ranges import hour_after, hour_floor, moment_in

SAO_PAULO = zoneinfo.ZoneInfo("America/Sao_Paulo")  # UTC-3, no summer time
KOLKATA = zoneinfo.ZoneInfo("Asia/Kolkata")  # UTC+5:30


def test_a_date_is_the_whole_day_in_the_zone() -> None:
    since = moment_in("2026-12-03", SAO_PAULO, end=False)
    until = moment_in("2026-12-03", SAO_PAULO, end=True)

    assert (since, until) == (
        datetime(2026, 12, 3, 3, tzinfo=UTC),
        datetime(2026, 12, 4, 3, tzinfo=UTC),
    )


def test_a_time_without_an_offset_is_a_time_in_the_zone_and_one_with_an_offset_keeps_it() -> None:
    naive = moment_in("2026-12-03T10:00", SAO_PAULO, end=False)
    offset = moment_in("2026-12-03T10:00Z", SAO_PAULO, end=False)

    assert naive == datetime(2026, 12, 3, 13, tzinfo=UTC)
    assert offset == datetime(2026, 12, 3, 10, tzinfo=UTC)


def test_hours_are_utc_hours_in_a_zone_half_an_hour_off() -> None:
    moment = datetime(2026, 12, 3, 10, 15, tzinfo=KOLKATA)  # 04:45 UTC

    assert (hour_floor(moment), hour_after(moment)) == (
        datetime(2026, 12, 3, 4, tzinfo=UTC),
        datetime(2026, 12, 3, 5, tzinfo=UTC),
    )


@pytest.mark.parametrize("text", ["yesterday", "1999-12-31", "9999-01-01T00:00Z"])
def test_what_cannot_be_read_says_why(text: str) -> None:
    with pytest.raises(ValueError, match=r"date|time"):
        moment_in(text, UTC, end=False)


@pytest.mark.django_db
def test_the_api_reads_a_time_without_an_offset_as_utc_and_says_so() -> None:
    manager = User.objects.create_user("max", password="pw")
    manager.groups.add(Group.objects.create(name="managers"))
    client = Client()
    client.force_login(manager)

    body = client.get(
        "/api/v1/metrics", {"since": "2026-12-03T10:00", "until": "2026-12-03"}
    ).json()

    assert body["time_zone"] == "UTC"
    assert (body["since"], body["until"]) == (
        "2026-12-03T10:00:00+00:00",
        "2026-12-04T00:00:00+00:00",
    )

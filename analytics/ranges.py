"""Hours, days and ranges: the one notion of time the managers' pages and API share.

The rollups count UTC hours and UTC days, so a range is cut at UTC hours (some zones are not a
whole hour off UTC). What a reader types is read in a time zone: the pages read it in the reader's
own (the zone the browser reported, shown on the page), the API in UTC (and says so). Either way
a date alone is that whole day in the zone, and a time without an offset is a time in the zone.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, tzinfo

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# A range reads at most a year of rollups.
LONGEST_RANGE = 366 * DAY
# What a reader may ask for: this service has no calls outside these.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def hour_floor(moment: datetime) -> datetime:
    """The UTC hour `moment` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_after(moment: datetime) -> datetime:
    """The end of the UTC hour `moment` falls in, unless it is an hour already: a rollup row
    whose hour starts before `moment` counts all of that hour."""
    floor = hour_floor(moment)
    return floor if floor == moment else floor + HOUR


def utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def midnight(day: date, zone: tzinfo = UTC) -> datetime:
    """The first moment of `day` in `zone`."""
    return timezone.make_aware(datetime.combine(day, time()), zone)


def whole_utc_days(start: datetime, end: datetime) -> tuple[date, date]:
    """The UTC days wholly inside [start, end): from the first up to the last, excluded."""
    first = utc_day(start)
    if midnight(first) < start:
        first += DAY
    return first, max(first, utc_day(end))


def days_begin_at_utc_midnight(start: datetime, end: datetime) -> bool:
    """Whether the reader's calendar days in [start, end) begin at UTC midnights."""
    moment = start
    while moment <= end:
        if timezone.localtime(moment).utcoffset():
            return False
        moment += DAY
    return True


def moment_in(text: str, zone: tzinfo, *, end: bool) -> datetime:
    """What a reader typed, read in `zone`: a date (YYYY-MM-DD) is that whole day, from its start
    (`end` False) or until its end (`end` True); a time (ISO 8601) without an offset is a time in
    the zone. ValueError says what is wrong with it, in the reader's words."""
    try:
        day = parse_date(text)
        moment = None if day is not None else parse_datetime(text)
    except ValueError:
        day, moment = None, None
    if day is not None:
        if not EARLIEST.date() <= day <= LATEST.date():
            raise ValueError(f"{text} is not a date this service has calls for.")
        return midnight(day + DAY if end else day, zone)
    if moment is None:
        raise ValueError(f"'{text}' is neither a date (YYYY-MM-DD) nor a time (ISO 8601).")
    aware = moment if timezone.is_aware(moment) else timezone.make_aware(moment, zone)
    if not EARLIEST <= aware <= LATEST:
        raise ValueError(f"{text} is not a time this service has calls for.")
    return aware


def range_problem(since: datetime, until: datetime) -> str | None:
    """Why [since, until) cannot be read, in the reader's words; None when it can."""
    if since >= until:
        return "The range must start before it ends."
    if until - since > LONGEST_RANGE:
        return "A range may be at most a year long."
    return None

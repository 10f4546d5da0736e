"""Times on the pages in the reader's own time zone.

The browser reports its zone (Intl's resolvedOptions().timeZone, set as a cookie by
static/toolgate/site.js); only a name of the zone database is accepted, and without one the
pages show UTC and say so.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from functools import cache

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

TIMEZONE_COOKIE = "tz"


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_from_cookie(value: str | None) -> zoneinfo.ZoneInfo | None:
    # Only a name the zone database lists: a cookie is what any client says, and ZoneInfo would
    # otherwise read whatever file a crafted name points at.
    if not value or len(value) > 64 or value not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(value)


class BrowserTimezoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = zone_from_cookie(request.COOKIES.get(TIMEZONE_COOKIE))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()

"""Drift found at run time, recorded for administrators (upstreams.models.UpstreamDrift).

Called where a call meets it (an MCP upstream that no longer lists a declared tool when Toolgate
connects or lists its tools again, or describes one's arguments differently; an answer that
is not its declared shape). Recording never fails the call: a database
that cannot take the row now leaves the log line, which is written either way.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

logger = logging.getLogger("upstreams.drift")

# The kinds (upstreams.models.DriftKind).
TOOL_MISSING = "tool_missing"
ANSWER_SHAPE = "answer_shape"
INPUT_SCHEMA = "input_schema"


def drift_record(*, upstream: str, tool: str, kind: str, detail: str) -> None:
    """One row per upstream, tool and kind: the first sighting creates it, later ones count."""
    from upstreams.models import UpstreamDrift

    logger.warning("upstream %s drifted: %s %s (%s)", upstream, tool, kind, detail)
    now = timezone.now()
    fields = {"upstream": upstream[:64], "tool": tool[:128], "kind": kind}
    try:
        with transaction.atomic():
            seen = UpstreamDrift.objects.filter(**fields).update(
                last_seen=now, seen=F("seen") + 1, detail=detail[:300], resolved_at=None
            )
            if seen:
                return
        with transaction.atomic():
            UpstreamDrift.objects.create(
                **fields, detail=detail[:300], first_seen=now, last_seen=now
            )
    except IntegrityError:
        # Another process recorded it first: it is recorded.
        return
    except DatabaseError:
        logger.exception("upstream %s: its drift could not be recorded", upstream)


def drifts_open() -> list[object]:
    """The drift administrators have not resolved, the latest first."""
    from upstreams.models import UpstreamDrift

    return list(UpstreamDrift.objects.filter(resolved_at=None).order_by("-last_seen")[:10])

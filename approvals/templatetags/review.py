"""What the reviewer pages show of amounts, statuses and times."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil

register = template.Library()

# Each status with a sign of its own as well as a colour, so that none depends on telling colours
# apart: (sign, words, style).
STATUSES = {
    "pending": ("◷", "Pending", "pending"),
    "approved": ("✓", "Approved, waiting to execute", "progress"),
    "executing": ("↻", "Executing", "progress"),
    "executed": ("✓", "Executed", "done"),
    "failed": ("✕", "Failed", "bad"),
    "unknown": ("?", "Outcome unknown", "warn"),
    "rejected": ("✕", "Rejected", "bad"),
    "expired": ("◌", "Expired", "neutral"),
    "invalidated": ("⊘", "Invalidated", "neutral"),
    "withdrawn": ("↩", "Withdrawn", "neutral"),
    "superseded": ("✎", "Edited: superseded", "neutral"),
}


@register.simple_tag
def status_pill(status: str) -> SafeString:
    sign, words, style = STATUSES.get(status, ("•", status, "neutral"))
    return format_html(
        '<span class="pill pill-{}"><span aria-hidden="true">{}</span> {}</span>',
        style,
        sign,
        words,
    )


@register.simple_tag
def moment(value: datetime | None, *, precise: bool = False) -> SafeString | str:
    """A relative time ("in 23 minutes", "5 minutes ago") with the exact local time on hover,
    or the exact local time with the relative one on hover (precise)."""
    if value is None:
        return ""
    now = timezone.now()
    if abs((value - now).total_seconds()) < 60:
        relative = "just now"
    elif value >= now:
        relative = f"in {timeuntil(value, now, depth=1)}"
    else:
        relative = f"{timesince(value, now, depth=1)} ago"
    local = timezone.localtime(value)
    exact = local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or "")
    shown, hover = (exact, relative) if precise else (relative, exact)
    return format_html('<time datetime="{}" title="{}">{}</time>', value.isoformat(), hover, shown)


@register.simple_tag
def fact_value(detail: Any) -> SafeString | str:
    """A fact of a held call's subject as a page shows it: a moment as a date, anything else as
    its text (approvals.selectors.Detail)."""
    if getattr(detail, "moment", None) is not None:
        return moment(detail.moment)
    return str(detail.value)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@register.simple_tag
def zone_name() -> str:
    return str(timezone.get_current_timezone_name())


EVENT_VERBS = {
    "voted": "approved (a vote)",
    "approved": "approved",
    "rejected": "rejected",
    "expired": "expired it: no reviewer decided in time",
    "invalidated": "invalidated it: the check at approval failed, nothing executed",
    "executing": "started executing",
    "executed": "executed it",
    "failed": "failed: nothing moved",
    "unknown": "could not learn the outcome",
    "reconciled": "reconciled it with the system of record",
    "withdrawn": "withdrew it: nothing executed",
    "escalated": "escalated it: nobody had decided",
    "reminded": "told the reviewers again before it expires",
    "edited": "edited it before approving",
    "superseded": "edited it into another call, which takes its place",
}


@register.simple_tag
def event_verb(kind: str) -> str:
    return EVENT_VERBS.get(kind, kind)

"""How the managers' pages write figures, times, codes and money."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from dispatch.money import money
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK, Code
from dispatch.pipeline.what_if import Tally
from dispatch.registry import tool_registry

# The pipeline's stages (docs/pipeline.md), by the number each code carries.
STAGES = {
    0: "step budget",
    1: "tool",
    2: "JSON",
    3: "schema",
    4: "idempotency",
    5: "business rules",
    6: "policy",
    7: "confirmation",
    8: "execution",
}


def count(value: int) -> str:
    return f"{value:,}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def calls(number: int) -> str:
    return f"{number:,} call{'s' if number != 1 else ''}"


def amounts(tally: Tally) -> str:
    """The money of a tally, currency by currency."""
    if not tally.calls:
        return "\u2013"
    return " + ".join(money(cents, currency) for currency, cents in tally.cents.items())


def when(moment: datetime) -> str:
    """A moment in the reader's time zone."""
    local = timezone.localtime(moment)
    return f"{local.day} {local:%b %Y %H:%M}"


def iso(moment: datetime) -> str:
    """A moment in a URL: UTC, to the minute."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def url(name: str, params: Mapping[str, str], *args: object) -> str:
    return reverse(name, args=args) + ("?" + urlencode(params) if params else "")


def code_of(name: str) -> Code | None:
    try:
        return tool_registry.catalogue[name]
    except KeyError:  # a code no longer declared, in an old record
        return None


def code_kind(name: str) -> str:
    """How a code reads on the pages: passed, held for a human, or rejected."""
    if name == OK.name:
        return "ok"
    if name == CONFIRMATION_REQUIRED.name:
        return "held"
    return "rejected"


def stage(code: str) -> str:
    """The stage of the pipeline a code comes from, by number and name."""
    known = code_of(code)
    if known is None:
        return ""
    return f"{known.stage} · {STAGES.get(known.stage, '')}"

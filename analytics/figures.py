"""The dashboard's headline figures and its table of calls by tool and code, laid out from the
selectors' figures: each number with the URL of the calls behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.http import QueryDict

from analytics.charts import tools_grouped, unknown_tools
from analytics.formatting import code_kind, code_of, count, percent, url
from analytics.forms import Scope
from analytics.selectors import CallFigures
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, LOOP_DETECTED, Code
from dispatch.registry import tool_registry


@dataclass(frozen=True)
class Headline:
    label: str
    value: str
    # "vs 180 in the 24 hours before"
    previous: str
    # "▲ 12 %", "▼ 2.1 pp", "no change"; a rate changes by percentage points.
    change: str
    definition: str
    url: str
    # A rate's count: "1 of 3 calls".
    counted: str = ""


@dataclass(frozen=True)
class Before:
    """What the headlines compare with: the period of the same length just before."""

    words: str
    quiet: bool


def headlines(
    scope: Scope, figures: CallFigures, before: CallFigures, held: int, held_before: int
) -> list[Headline]:
    """The five figures at the top, each beside its value over the period just before."""
    then = Before(f"the {scope.span_words()} before", before.total.calls == 0)
    now, past = figures.total, before.total
    return [
        _count_headline(
            scope,
            then,
            "Calls",
            (now.calls, past.calls),
            "Every tool call an agent sent, whatever its outcome.",
        ),
        _rate_headline(
            scope,
            then,
            "Rejection rate",
            (now.rejection_rate, past.rejection_rate),
            "Rejected calls out of all calls; a call held for a human is not rejected.",
            outcome="rejected",
            counted=f"{count(now.rejected)} of {count(now.calls)} calls",
        ),
        _rate_headline(
            scope,
            then,
            "Recovery rate",
            (now.recovery_rate, past.recovery_rate),
            "Of the rejections the model can fix, the share it fixed within its next 3 calls "
            "to the same tool in the session.",
            outcome="correctable",
            counted=f"{count(now.recovered)} of {count(now.correctable)} fixable rejections",
        ),
        _count_headline(
            scope,
            then,
            "Loop detections",
            (_code_calls(figures, LOOP_DETECTED), _code_calls(before, LOOP_DETECTED)),
            "Calls refused because the same call was repeated more often than the policy allows.",
            code=LOOP_DETECTED.name,
        ),
        _count_headline(
            scope,
            then,
            "Held calls",
            (held, held_before),
            "Calls that passed every check and were held for a human to decide.",
            outcome="held",
        ),
    ]


def _count_headline(
    scope: Scope,
    then: Before,
    label: str,
    values: tuple[int, int],
    definition: str,
    **drill: str,
) -> Headline:
    now, before = values
    return Headline(
        label,
        count(now),
        f"no calls in {then.words}" if then.quiet else f"vs {count(before)} in {then.words}",
        "" if then.quiet else _change_in_count(now, before),
        definition,
        url("analytics:calls", scope.exact(**drill)),
    )


def _rate_headline(
    scope: Scope,
    then: Before,
    label: str,
    values: tuple[float | None, float | None],
    definition: str,
    *,
    counted: str,
    **drill: str,
) -> Headline:
    now, before = values
    return Headline(
        label,
        percent(now),
        f"no calls in {then.words}" if then.quiet else f"vs {percent(before)} in {then.words}",
        _change_in_rate(now, before),
        definition,
        url("analytics:calls", scope.exact(**drill)),
        counted,
    )


def _change_in_count(now: int, before: int) -> str:
    if now == before:
        return "no change"
    if before == 0:
        return "▲ new"
    ratio = (now - before) / before
    return f"{'▲' if ratio > 0 else '▼'} {abs(ratio) * 100:.0f} %"


def _change_in_rate(now: float | None, before: float | None) -> str:
    if now is None or before is None:
        return ""
    points = (now - before) * 100
    if abs(points) < 0.05:
        return "no change"
    return f"{'▲' if points > 0 else '▼'} {abs(points):.1f} pp"


def _code_calls(figures: CallFigures, code: Code) -> int:
    tally = figures.by_code.get(code.name)
    return 0 if tally is None else tally.calls


# The table of calls by tool and code --------------------------------------------------------------


@dataclass(frozen=True)
class TableRow:
    tool: str
    code: str
    meaning: str
    kind: str
    calls: int
    share: float
    correctable: int
    recovered: int
    url: str
    recovery_url: str
    # For the entry of the unknown tools: the names it stands for.
    names: tuple[str, ...] = ()

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.correctable if self.correctable else None

    @property
    def share_text(self) -> str:
        return percent(self.share)

    @property
    def recovery_text(self) -> str:
        return percent(self.recovery_rate)


TABLE_SORTS = {
    "calls": lambda row: (-row.calls, row.tool, row.code),
    "tool": lambda row: (row.tool, row.code),
    "code": lambda row: (row.code, row.tool),
    "recovery": lambda row: (
        -(row.recovery_rate if row.recovery_rate is not None else -1.0),
        -row.calls,
        row.tool,
        row.code,
    ),
}


def table_rows(scope: Scope, figures: CallFigures, sort: str) -> list[TableRow]:
    """The rows of tool and code; the tools no agent may call are one entry per code."""
    unknown = unknown_tools(figures)
    grouped = tools_grouped(figures, unknown)
    total = grouped.total.calls
    rows = [
        TableRow(
            tool=tool,
            code=code,
            meaning=(known.meaning if (known := code_of(code)) is not None else ""),
            kind=code_kind(code),
            calls=tally.calls,
            share=tally.calls / total if total else 0.0,
            correctable=tally.correctable,
            recovered=tally.recovered,
            url=url("analytics:calls", unknown.drill(scope, tool, code=code)),
            recovery_url=url(
                "analytics:calls", unknown.drill(scope, tool, code=code, outcome="correctable")
            ),
            names=unknown.names if tool == unknown.label else (),
        )
        for (tool, code), tally in grouped.by_tool_code.items()
        if tally.calls
    ]
    return sorted(rows, key=TABLE_SORTS.get(sort, TABLE_SORTS["calls"]))


def columns(query: QueryDict, sort: str) -> list[dict[str, Any]]:
    """The table's headers: a sortable one links to the table sorted by it."""
    headers = []
    for key, label, numeric in (
        ("tool", "Tool", False),
        ("code", "Code", False),
        ("calls", "Calls", True),
        ("", "Share", True),
        ("recovery", "Recovery rate", True),
    ):
        direction = "ascending" if key in ("tool", "code") else "descending"
        headers.append(
            {
                "label": label,
                "numeric": numeric,
                "url": "?" + scope_query(query, sort=key) if key else None,
                "sorted": direction if key == sort else None,
                "arrow": "↑" if direction == "ascending" else "↓",
            }
        )
    return headers


def scope_query(query: QueryDict, **changes: str) -> str:
    """The page's own query string with some parameters changed (sorting, a page)."""
    params = {key: query.get(key, "") for key in ("range", "since", "until", "agent", "tool")}
    params.update(changes)
    return urlencode({key: value for key, value in params.items() if value})


# Tool versions side by side ----------------------------------------------------------------------


def version_note(name: str) -> str:
    """Where a tool stands in its line of versions (docs/tools.md): "retired · replaced by
    refund_order_v2", "replaces refund_order"; "" for a tool without versions."""
    spec = tool_registry.get(name)
    if spec is None:
        return ""
    notes = []
    if spec.retired:
        notes.append("retired")
    newer = tool_registry.replaced_by(name)
    if newer is not None:
        notes.append(f"replaced by {newer}")
    if spec.replaces is not None:
        notes.append(f"replaces {spec.replaces}")
    return " · ".join(notes)


@dataclass(frozen=True)
class VersionRow:
    tool: str
    note: str
    retired: bool
    calls: int
    rejected: int
    correctable: int
    recovered: int
    held: int
    calls_url: str
    rejected_url: str
    held_url: str
    dashboard_url: str

    @property
    def rejection_text(self) -> str:
        return percent(self.rejected / self.calls if self.calls else None)

    @property
    def recovery_text(self) -> str:
        return percent(self.recovered / self.correctable if self.correctable else None)


def version_lines(scope: Scope, figures: CallFigures, query: QueryDict) -> list[list[VersionRow]]:
    """Each line of versions whose tools had calls in the range, a row a version, oldest first:
    its own calls, rejections, recovery and held calls, each leading to its calls."""
    lines = []
    for line in tool_registry.version_lines():
        rows = []
        for spec in line:
            tally = figures.by_tool.get(spec.name)
            held = figures.by_tool_code.get((spec.name, CONFIRMATION_REQUIRED.name))
            rows.append(
                VersionRow(
                    tool=spec.name,
                    note=version_note(spec.name),
                    retired=spec.retired,
                    calls=tally.calls if tally else 0,
                    rejected=tally.rejected if tally else 0,
                    correctable=tally.correctable if tally else 0,
                    recovered=tally.recovered if tally else 0,
                    held=held.calls if held else 0,
                    calls_url=url("analytics:calls", {**scope.exact(), "tool": spec.name}),
                    rejected_url=url(
                        "analytics:calls", {**scope.exact(outcome="rejected"), "tool": spec.name}
                    ),
                    held_url=url(
                        "analytics:calls", {**scope.exact(outcome="held"), "tool": spec.name}
                    ),
                    dashboard_url="?" + scope_query(query, tool=spec.name),
                )
            )
        if any(row.calls for row in rows):
            lines.append(rows)
    return lines

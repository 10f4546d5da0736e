"""The managers' pages: the dashboard, the calls behind each of its figures, a call, a session's
timeline and the CSV of the calls of a range.

Every figure comes from analytics.selectors; these views only take the range and filters from the
query string (analytics/forms.py) and lay the figures out (figures.py, charts.py). The pages work
without JavaScript; static/analytics/analytics.js draws the charts from the same figures and
makes their bars into links.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from analytics import formatting
from analytics.channels import channel_figures
from analytics.charts import chart_data
from analytics.decisions import DECIDING_EVENTS
from analytics.figures import (
    TABLE_SORTS,
    columns,
    headlines,
    scope_query,
    table_rows,
    version_lines,
    version_note,
)
from analytics.forms import (
    CALL_FILTERS,
    DRILLDOWN_FILTERS,
    OUTCOME_WORDS,
    RANGES,
    CallsForm,
    Scope,
    scope_from,
)
from analytics.permissions import Reader, is_manager, managers_and_reviewers, managers_only
from analytics.selectors import (
    CallFigures,
    call_figures,
    calls_behind,
    calls_narrowed,
    confirmation_outcomes,
    held_calls_behind,
    held_count,
    rollups_freshness,
)
from approvals.models import ConfirmationEvent
from approvals.reviewers import is_reviewer
from dispatch.models import Agent, AuditRecord, CallChannel, Confirmation
from dispatch.registry import tool_registry

CALLS_PER_PAGE = 50
# The most calls a list counts: past it the page says "more than", so that a search matching
# most of a long audit trail costs no more than a page of it.
CALLS_COUNTED = 10_000
# How much of the raw arguments a list shows; the call's own page shows them whole.
RAW_SHOWN = 160


@require_GET
@managers_only
def dashboard(request: HttpRequest) -> HttpResponse:
    scope, form = scope_from(request.GET)
    figures = call_figures(**scope.filters(), bucket=scope.bucket)
    context: dict[str, Any] = {
        "scope": scope,
        "form": form,
        "ranges": RANGES,
        "agents": Agent.objects.order_by("name"),
        "tools": _tool_choices(scope),
        "tool_note": version_note(scope.tool) if scope.tool else "",
        "any_calls": figures.total.calls > 0 or AuditRecord.objects.exists(),
        "has_calls": figures.total.calls > 0,
        "since_date": scope.since_date(),
        "until_date": scope.until_date(),
        "export_query": scope_query(request.GET),
        "tz_name": timezone.get_current_timezone_name(),
        "freshness": rollups_freshness(),
    }
    if figures.total.calls:
        context.update(_dashboard_figures(request, scope, figures))
    return render(request, "analytics/dashboard.html", context)


def _dashboard_figures(request: HttpRequest, scope: Scope, figures: CallFigures) -> dict[str, Any]:
    """What the dashboard shows of a range with calls: headlines, charts and the table."""
    previous = scope.previous()
    # Only its totals are shown.
    before = call_figures(**previous.filters(), bucket=None)
    outcomes = confirmation_outcomes(**scope.filters())
    charts = chart_data(scope, figures, outcomes)
    sort = request.GET.get("sort", "calls")
    sort = sort if sort in TABLE_SORTS else "calls"
    held, held_before = sum(outcomes["by_status"].values()), held_count(**previous.filters())
    return {
        "headlines": headlines(scope, figures, before, held, held_before),
        "charts": charts,
        # The rows are the tables beside the charts; the browser needs only the series.
        "charts_drawn": {
            name: {key: value for key, value in chart.items() if key != "rows"}
            for name, chart in charts.items()
        },
        "rows": table_rows(scope, figures, sort),
        # Each tool's versions beside each other; with one tool chosen, its own figures alone.
        "version_lines": [] if scope.tool else version_lines(scope, figures, request.GET),
        "sort": sort,
        "columns": columns(request.GET, sort),
        "total_calls": figures.total.calls,
        "channels": channel_figures(**scope.filters()) if held else None,
    }


def _tool_choices(scope: Scope) -> list[tuple[str, str]]:
    """The tools to filter by, each with where it stands among its versions."""
    tools = sorted(spec.name for spec in tool_registry)
    if scope.tool and scope.tool not in tools:
        tools.append(scope.tool)
    return [(tool, version_note(tool)) for tool in tools]


# The CSV of the calls ---------------------------------------------------------------------------

# One row a call, the columns of the calls page.
CSV_COLUMNS = (
    "call_id",
    "at",
    "agent",
    "session_id",
    "customer_id",
    "channel",
    "step",
    "tool",
    "code",
    "outcome",
    "replayed",
    "confirmation_id",
    "confirmation_status",
    "arguments",
    "message",
)
# Calls read from the database at a time while the CSV is written.
CSV_CHUNK = 2000


def _cell(value: object) -> object:
    # A tool name or arguments are whatever a model sent: a spreadsheet must not run them as a
    # formula.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


class _Echo:
    """A file that hands back what is written to it: csv.writer's rows as the response's
    chunks."""

    def write(self, value: str) -> str:
        return value


@require_GET
@managers_only
def export_csv(request: HttpRequest) -> HttpResponseBase:
    """The calls of the range (and of the calls page's filters), one row a call, at most
    TOOLGATE_CSV_MAX_ROWS of them: a range that holds more is sent back to narrow, before any
    byte of the file."""
    scope, _ = scope_from(request.GET)
    form = CallsForm(request.GET)
    form.is_valid()
    data = {key: form.cleaned_data.get(key) or "" for key in (*DRILLDOWN_FILTERS, *CALL_FILTERS)}
    records = calls_for(scope, data)
    limit = settings.TOOLGATE_CSV_MAX_ROWS
    # One more than the limit tells "more" without counting a large range to its end.
    found = records.order_by()[: limit + 1].count()
    if found > limit:
        messages.error(
            request,
            f"The range holds more than {formatting.count(limit)} calls, the most one CSV "
            "holds: narrow the range (or choose an agent or a tool) and download again.",
        )
        # Back where the download was asked for: the calls page keeps its filters.
        if any(request.GET.get(key) for key in CALL_FILTERS):
            return redirect(f"{reverse('analytics:calls')}?{request.GET.urlencode()}")
        return redirect(f"{reverse('analytics:dashboard')}?{scope_query(request.GET)}")
    name = f"toolgate-calls-{formatting.iso(scope.since)}-{formatting.iso(scope.until)}.csv"
    response = StreamingHttpResponse(
        _csv_rows(records.order_by("at", "id")), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{name.replace(":", "")}"'
    return response


def _csv_rows(records: QuerySet[AuditRecord]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    names = dict(Agent.objects.values_list("pk", "name"))
    for chunk in _chunks(records):
        held = dict(
            Confirmation.objects.filter(
                pk__in={r.confirmation_id for r in chunk if r.confirmation_id}
            ).values_list("pk", "status")
        )
        for record in chunk:
            yield writer.writerow(
                [
                    record.call_id,
                    record.at.isoformat(),
                    _cell(names.get(record.agent_id, str(record.agent_id))),
                    _cell(record.session_id),
                    _cell(record.customer_id),
                    record.channel,
                    "" if record.step is None else record.step,
                    _cell(record.tool),
                    record.code,
                    formatting.code_kind(record.code),
                    "yes" if record.replayed else "no",
                    record.confirmation_id,
                    held.get(record.confirmation_id, ""),
                    _cell(record.raw_arguments),
                    _cell(record.message),
                ]
            )


def _chunks(records: QuerySet[AuditRecord]) -> Iterator[list[AuditRecord]]:
    chunk: list[AuditRecord] = []
    for record in records.iterator(chunk_size=CSV_CHUNK):
        chunk.append(record)
        if len(chunk) == CSV_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# The calls behind a figure ---------------------------------------------------------------------


@dataclass(frozen=True)
class CallRow:
    record: AuditRecord
    agent_name: str
    raw_shown: str
    truncated: bool
    stage: str
    kind: str
    confirmation: Confirmation | None
    confirmation_url: str | None
    # Who settled the held call: a reviewer's name, or "expiry".
    decided_by: str


def confirmation_url(user: Reader, confirmation_id: str) -> str | None:
    """Where a held call's confirmation is read: a reviewer's own page, where they may decide it,
    or the read-only page of the records that managers read."""
    if not confirmation_id:
        return None
    if is_reviewer(user):
        try:
            return reverse("approvals:detail", args=[confirmation_id])
        except NoReverseMatch:
            pass
    return reverse("records:confirmation", args=[confirmation_id])


def call_rows(records: Iterable[AuditRecord], user: Reader) -> list[CallRow]:
    records = list(records)
    names = dict(
        Agent.objects.filter(pk__in={r.agent_id for r in records}).values_list("pk", "name")
    )
    held = Confirmation.objects.in_bulk({r.confirmation_id for r in records if r.confirmation_id})
    deciders = dict(
        ConfirmationEvent.objects.filter(
            confirmation_id__in=held, kind__in=DECIDING_EVENTS
        ).values_list("confirmation_id", "actor_label")
    )
    rows = []
    for record in records:
        raw = record.raw_arguments
        rows.append(
            CallRow(
                record=record,
                agent_name=names.get(record.agent_id, str(record.agent_id)),
                raw_shown=raw if len(raw) <= RAW_SHOWN else raw[:RAW_SHOWN] + "…",
                truncated=len(raw) > RAW_SHOWN,
                stage=formatting.stage(record.code),
                kind=formatting.code_kind(record.code),
                confirmation=held.get(record.confirmation_id),
                confirmation_url=confirmation_url(user, record.confirmation_id),
                decided_by=deciders.get(record.confirmation_id, ""),
            )
        )
    return rows


def calls_for(scope: Scope, data: Mapping[str, Any]) -> QuerySet[AuditRecord]:
    outcome = data.get("outcome") or ""
    if outcome == "held":
        records = held_calls_behind(
            **scope.filters(),
            status=data.get("status") or None,
            decided_by=data.get("decided_by") or None,
        )
        if data.get("code"):
            records = records.filter(code=data["code"])
    else:
        records = calls_behind(
            **scope.filters(),
            code=data.get("code") or None,
            rejected=outcome == "rejected",
            correctable=outcome == "correctable",
            replayed=outcome == "replayed",
        )
    return calls_narrowed(
        records,
        customer=data.get("customer") or None,
        session=data.get("session") or None,
        channel=data.get("channel") or None,
        search=data.get("q") or None,
    )


def _describe(scope: Scope, data: Mapping[str, Any]) -> list[str]:
    """The filters, in words, for the page's heading."""
    words = [f"{formatting.when(scope.since)} to {formatting.when(scope.until)}"]
    if scope.agent is not None:
        words.append(f"agent {scope.agent.name}")
    if scope.tool:
        words.append(f"tool {scope.tool}")
    if data.get("code"):
        words.append(f"code {data['code']}")
    if data.get("outcome"):
        words.append(OUTCOME_WORDS[data["outcome"]])
    if data.get("status"):
        words.append(f"now {data['status']}")
    if data.get("decided_by"):
        words.append(f"decided by {data['decided_by']}")
    if data.get("customer"):
        words.append(f"customer {data['customer']}")
    if data.get("session"):
        words.append(f"session {data['session']}")
    if data.get("channel"):
        words.append(f"over {CallChannel(data['channel']).label}")
    if data.get("q"):
        words.append(f"arguments containing “{data['q']}”")
    return words


class CountedUpTo:
    """A query's records for a paginator that counts no further than `most`."""

    ordered = True

    def __init__(self, records: QuerySet[AuditRecord], most: int) -> None:
        self.records = records
        self.most = most
        self.more = False

    def count(self) -> int:
        counted = self.records[: self.most + 1].count()
        self.more = counted > self.most
        return min(counted, self.most)

    def __getitem__(self, index: slice) -> QuerySet[AuditRecord]:
        return self.records[index]


@require_GET
@managers_only
def calls(request: HttpRequest) -> HttpResponse:
    scope, _ = scope_from(request.GET)
    form = CallsForm(request.GET)
    form.is_valid()
    # A filter that is not valid is left out (and the form says why); the others still apply.
    data = {key: form.cleaned_data.get(key) or "" for key in (*DRILLDOWN_FILTERS, *CALL_FILTERS)}
    records = CountedUpTo(calls_for(scope, data).order_by("-at", "-id"), CALLS_COUNTED)
    page: Page[AuditRecord] = Paginator(records, CALLS_PER_PAGE).get_page(  # type: ignore[arg-type]
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "scope": scope,
        "form": form,
        "description": _describe(scope, data),
        "page": page,
        "more_than_counted": records.more,
        "rows": call_rows(page.object_list, request.user),
        "page_query": query.urlencode(),
        "dashboard_query": scope_query(request.GET),
        "filtered": any(data.values()) or scope.agent is not None or bool(scope.tool),
        "ranges": RANGES,
        "agents": Agent.objects.order_by("name"),
        "tools": _tool_choices(scope),
        "channels": CallChannel.choices,
        # An exact range from a figure stays exact; otherwise the range's days.
        "since_value": request.GET.get("since") or scope.since_date(),
        "until_value": request.GET.get("until") or scope.until_date(),
        "kept": {key: data[key] for key in ("outcome", "status", "decided_by") if data[key]},
    }
    return render(request, "analytics/calls.html", context)


@require_GET
@managers_and_reviewers
def call_detail(request: HttpRequest, call_id: str) -> HttpResponse:
    record = get_object_or_404(AuditRecord, call_id=call_id)
    row = call_rows([record], request.user)[0]
    known = formatting.code_of(record.code)
    return render(
        request,
        "analytics/call.html",
        {
            "row": row,
            "record": record,
            "meaning": known.meaning if known else "",
            "validated": json.dumps(record.arguments, indent=2, ensure_ascii=False),
        },
    )


# A session's timeline --------------------------------------------------------------------------


@require_GET
@managers_and_reviewers
def session_timeline(request: HttpRequest, agent_id: int, session_id: str) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=agent_id)
    records = AuditRecord.objects.filter(agent=agent, session_id=session_id).order_by(
        "step", "at", "id"
    )
    rows = call_rows(records, request.user)
    if not rows:
        raise Http404("No calls in that session.")
    return render(
        request,
        "analytics/session.html",
        {
            "agent": agent,
            "session_id": session_id,
            "customer_id": rows[0].record.customer_id,
            "rows": rows,
            "first": rows[0].record.at,
            "last": rows[-1].record.at,
            "rejected": sum(1 for row in rows if row.kind == "rejected"),
            "is_manager": is_manager(request.user),
        },
    )

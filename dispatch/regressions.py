"""The regression corpus: rejected payloads from the audit records, kept as tests forever.

Only rejections of stages 1 to 3 are cases (unknown tool, tool not allowed, invalid JSON, invalid
arguments): their code depends on the call alone, never on live state, so the pipeline must judge
a case the same way for as long as the tool is declared as it is. tests/regressions/ replays
every case of the committed corpus.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from dispatch.models import AuditRecord
from dispatch.models import Policy as PolicyVersion
from dispatch.pipeline import Pipeline, Policy, ToolCall
from dispatch.pipeline.engine import Limits
from dispatch.pipeline.results import CallResult
from dispatch.registry import tool_registry

# The stages whose codes depend on nothing but the call.
CALL_ONLY_STAGES = frozenset({1, 2, 3})
TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"


@dataclass(frozen=True, slots=True)
class RegressionCase:
    """One payload that was rejected, and the code it must keep getting."""

    tool: str
    # The raw arguments as the audit record keeps them: the model's text, or the host's object
    # as compact JSON.
    arguments: str
    code: str
    # The message the model was given then; for reading only, as messages improve.
    message: str = ""
    # The agent's allowlist, for a tool that was not on it.
    allowed_tools: tuple[str, ...] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.tool, self.arguments)

    def as_line(self) -> str:
        document: dict[str, Any] = {
            "tool": self.tool,
            "arguments": self.arguments,
            "code": self.code,
            "message": self.message,
        }
        if self.allowed_tools is not None:
            document["allowed_tools"] = list(self.allowed_tools)
        # ASCII only: a look-alike or invisible character shows as its escape in a diff.
        return json.dumps(document, ensure_ascii=True)

    @classmethod
    def from_line(cls, line: str) -> RegressionCase:
        document = json.loads(line)
        allowed = document.get("allowed_tools")
        return cls(
            tool=str(document["tool"]),
            arguments=str(document["arguments"]),
            code=str(document["code"]),
            message=str(document.get("message", "")),
            allowed_tools=None if allowed is None else tuple(str(name) for name in allowed),
        )

    def call(self, *, session_id: str = "regression") -> ToolCall:
        return ToolCall(
            agent_id="regression",
            session_id=session_id,
            customer_id="regression",
            tool=self.tool,
            arguments=self.arguments,
        )

    def policy(self, tools: Iterable[str]) -> Policy:
        """A policy that lets the call through stage 1 unless the case says it was not allowed."""
        allowed = self.allowed_tools if self.allowed_tools is not None else tools
        return Policy(version=1, allowed_tools=frozenset(allowed), max_amount_cents=0)


def regression_codes() -> frozenset[str]:
    return frozenset(
        code.name for code in tool_registry.catalogue if code.stage in CALL_ONLY_STAGES
    )


@dataclass(frozen=True, slots=True)
class Export:
    cases: list[RegressionCase]
    # Records left out: their raw arguments may have been cut short by the audit, or the
    # pipeline, as it is now, judges them differently.
    cut_short: int = 0
    judged_differently: int = 0


def regression_cases(
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    codes: Collection[str] | None = None,
    known: Collection[tuple[str, str]] = (),
) -> Export:
    """The rejected payloads of stages 1 to 3 in [start, end), one case per tool and raw
    arguments (the first seen), leaving out those already `known`; sorted for stable files."""
    wanted = regression_codes() if codes is None else regression_codes() & set(codes)
    records = AuditRecord.objects.filter(ok=False, code__in=wanted).order_by("at", "id")
    if start is not None:
        records = records.filter(at__gte=start)
    if end is not None:
        records = records.filter(at__lt=end)

    limits = Limits(max_argument_bytes=settings.TOOLGATE_MAX_ARGUMENT_BYTES)
    pipeline = Pipeline(tool_registry, limits=limits)
    tools = [spec.name for spec in tool_registry]
    seen = set(known)
    cases: list[RegressionCase] = []
    cut_short = judged_differently = 0
    for record in _rejections(records):
        case = RegressionCase(
            tool=record["tool"],
            arguments=record["raw_arguments"],
            code=record["code"],
            message=record["message"],
            allowed_tools=record["allowed_tools"],
        )
        if case.key in seen:
            continue
        seen.add(case.key)
        if len(case.arguments) >= limits.audit_raw_chars:
            cut_short += 1
            continue
        checked = pipeline.prepare(case.call(), case.policy(tools)).checked
        if not isinstance(checked, CallResult) or checked.code != case.code:
            judged_differently += 1
            continue
        cases.append(case)
    cases.sort(key=lambda case: (case.tool, case.code, case.arguments))
    return Export(cases, cut_short, judged_differently)


def _rejections(records: Any) -> Iterator[dict[str, Any]]:
    allowlists: dict[tuple[int, int], tuple[str, ...]] = {}
    columns = ("agent_id", "policy_version", "tool", "raw_arguments", "code", "message")
    for record in records.values(*columns).iterator():
        allowed = None
        if record["code"] == TOOL_NOT_ALLOWED:
            version = (record["agent_id"], record["policy_version"])
            if version not in allowlists:
                policy = PolicyVersion.objects.filter(
                    agent_id=version[0], version=version[1]
                ).first()
                allowlists[version] = tuple(sorted(policy.allowed_tools if policy else ()))
            allowed = allowlists[version]
        yield {**record, "allowed_tools": allowed}

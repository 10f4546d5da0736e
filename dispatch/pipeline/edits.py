"""A reviewer's edit of a held call before approving it, judged as the pipeline judges a call.

A tool declares which of its arguments a reviewer may change and each one's rule
(ToolSpec.editable: an amount may only fall, a list may only shrink). An edit names only those
arguments; the call it makes is judged again from its schema on: the allowlist, the schema, the
business rules against the live state and the policy's limits, and it may move no more money
than what the model asked. What passes is the edited call's arguments (as JSON values) and its
money; what does not, words for the reviewer, and nothing is changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple

from dispatch.pipeline.engine import Refusal, allowed_tool, rules_refusal, valid_arguments
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.tools import EditRule, Money, ToolRegistry, ToolSpec


class EditedCall(NamedTuple):
    """The held call as the reviewer edited it: its arguments as JSON values, what changed
    (argument: (asked, edited)), and the money it moves (None for none)."""

    arguments: dict[str, Any]
    changed: dict[str, tuple[Any, Any]]
    money: Money | None


class EditRefused(NamedTuple):
    message: str


def edit_judge(
    registry: ToolRegistry,
    policy: Policy,
    *,
    tool: str,
    asked: Mapping[str, Any],
    changes: Mapping[str, Any],
    customer_id: str,
    asked_amount_cents: int | None,
) -> EditedCall | EditRefused:
    """The held call `asked` with the reviewer's `changes`, judged again under `policy` and the
    live state; `asked_amount_cents` is the money the held call moves (None for none)."""
    spec = registry.get(tool)
    if spec is None or not spec.editable:
        return EditRefused(
            f"{spec.title if spec else tool} cannot be edited: approve or reject it as asked."
        )
    refused = edit_refusal(spec, asked, changes)
    if refused is not None:
        return refused
    arguments = {**asked, **changes}
    allowed = allowed_tool(registry, policy, tool)
    if isinstance(allowed, Refusal):
        return EditRefused(f"The edited call is refused: {allowed.message}.")
    model = valid_arguments(spec, arguments)
    if isinstance(model, Refusal):
        return EditRefused(f"The edited call does not fit its schema: {model.message}.")
    money = rules_refusal(spec, model, customer_id, policy)
    if isinstance(money, Refusal):
        return EditRefused(f"The edited call does not pass its checks: {money.message}.")
    if asked_amount_cents is not None and (
        money is None or money.amount_cents > asked_amount_cents
    ):
        return EditRefused(
            "The edited call would move more money than the model asked: an edit may only lower it."
        )
    validated = model.__pydantic_serializer__.to_python(model, mode="json")
    changed = {
        name: (asked.get(name), validated.get(name))
        for name in changes
        if validated.get(name) != asked.get(name)
    }
    return EditedCall(dict(validated), changed, money)


def edit_refusal(
    spec: ToolSpec[Any], asked: Mapping[str, Any], changes: Mapping[str, Any]
) -> EditRefused | None:
    """Whether the changes keep to the tool's declared rules, before anything is read."""
    rules = {editable.argument: editable.rule for editable in spec.editable}
    allowed = " and ".join(f"{name} ({rule.words})" for name, rule in rules.items())
    for name in changes:
        if name not in rules:
            return EditRefused(
                f"{name} cannot be changed: of {spec.title}, a reviewer may change only {allowed}."
            )
    changed = False
    for name, value in changes.items():
        before = asked.get(name)
        rule = rules[name]
        if rule is EditRule.ONLY_LOWER:
            if not isinstance(value, int) or isinstance(value, bool):
                return EditRefused(f"{name}: give a whole number, in minor units (25.90 is 2590).")
            if isinstance(before, int) and value > before:
                return EditRefused(
                    f"{name}: {value} is more than the {before} asked; an edit may only lower it."
                )
        elif rule is EditRule.ONLY_FEWER:
            if not isinstance(value, list):
                return EditRefused(f"{name}: give a list, the asked one with entries left out.")
            extra = Counter(map(_hashable, value)) - Counter(map(_hashable, before or []))
            if extra:
                first = next(iter(extra))
                return EditRefused(
                    f"{name}: {first} was not asked (or not as often); an edit may only leave "
                    "entries out."
                )
        changed = changed or value != before
    if not changed:
        return EditRefused("Nothing was changed: approve it as asked, or change what may change.")
    return None


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int) else repr(value)


def edited_result(
    result: CallResult, *, asked: Mapping[str, Any], executed: Mapping[str, Any]
) -> CallResult:
    """The result of an edited call, saying what executed and that it differs from what the
    model asked: `edited` in its data, and a sentence in its text for the model."""
    changed = {
        name: {"asked": asked.get(name), "executed": value}
        for name, value in executed.items()
        if asked.get(name) != value
    }
    words = ", ".join(
        f"{name} {change['asked']} → {change['executed']}" for name, change in changed.items()
    )
    note = (
        f" A reviewer changed the call before approving it ({words}): what executed differs "
        "from what was asked. Tell the user what was done; do not send the asked call again."
    )
    return CallResult(
        result.call_id,
        result.ok,
        result.tool,
        result.code,
        result.message + note,
        {**result.data, "edited": changed},
        result.replayed,
        result.retryable,
        result.model_text + note,
    )

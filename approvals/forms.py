"""The reviewer's forms: a rejection needs a reason, which reaches the model; an edit names the
arguments its tool lets a reviewer change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import forms
from django.http import QueryDict

from approvals.selectors import EditField
from dispatch.money import AmountInvalid, minor_units

REASON_MAX_LENGTH = 500


class RejectForm(forms.Form):
    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "Say why: the reason is sent to the agent's model."},
    )


class EditInvalid(ValueError):
    """What the reviewer typed is not a value of its field; the message says which and why."""


def edit_changes(
    data: QueryDict, fields: Sequence[EditField], asked: Mapping[str, Any]
) -> dict[str, Any]:
    """The changes an edit form sends, as the service takes them (only the editable arguments,
    as JSON values): an amount in major units becomes minor units, a list keeps the entries left
    checked. Raises EditInvalid. The rules themselves are the service's to judge."""
    editable = {field.argument for field in fields}
    for name in data:
        if name in asked and name not in editable:
            allowed = " and ".join(f"{field.label} ({field.rule})" for field in fields)
            raise EditInvalid(
                f"{name} cannot be changed: a reviewer may change only {allowed or 'nothing'}."
            )
    changes: dict[str, Any] = {}
    for field in fields:
        name = field.argument
        if field.kind == "list":
            kept = data.getlist(name)
            if not all(position.isdigit() for position in kept):
                raise EditInvalid(f"{field.label}: choose among the entries asked.")
            positions = sorted({int(position) for position in kept})
            entries = asked.get(name)
            if not isinstance(entries, list) or any(p >= len(entries) for p in positions):
                raise EditInvalid(f"{field.label}: choose among the entries asked.")
            changes[name] = [entries[position] for position in positions]
            continue
        if name not in data:
            continue
        typed = data.get(name, "").strip()
        if not typed:
            raise EditInvalid(f"{field.label}: give a value ({field.rule}).")
        if field.kind == "amount":
            if "," in typed and "." not in typed:
                typed = typed.replace(",", ".")  # 60,00 as people write it in BRL and EUR
            try:
                changes[name] = minor_units(typed, field.currency)
            except AmountInvalid as exc:
                raise EditInvalid(f"{field.label}: {exc}.") from None
        else:
            if not typed.isdigit():
                raise EditInvalid(f"{field.label}: {typed!r} is not a whole number.")
            changes[name] = int(typed)
    return changes

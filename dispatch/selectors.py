"""Reads that take more than one line: what an agent may see of its own calls."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from dispatch.held_money import held_money_of
from dispatch.models import (
    CONFIRMATION_FINAL,
    Agent,
    AuditRecord,
    Confirmation,
    ConfirmationStatus,
    Session,
)
from dispatch.pipeline.tools import ToolSpec
from dispatch.registry import tool_registry


def tools_for_agent(agent: Agent) -> list[ToolSpec[Any]]:
    """The tools an agent is offered: those of its allowlist that are not retired."""
    allowed = set(agent.current_policy.allowed_tools) if agent.current_policy else set()
    return [spec for spec in tool_registry.listed() if spec.name in allowed]


def session_get(*, agent: Agent, session_id: str) -> Session | None:
    return Session.objects.filter(agent=agent, session_id=session_id).first()


def session_calls(*, agent: Agent, session_id: str) -> QuerySet[AuditRecord]:
    return AuditRecord.objects.filter(agent=agent, session_id=session_id).order_by("at", "id")


def confirmation_get(*, agent: Agent, confirmation_id: str) -> Confirmation | None:
    """A confirmation of this agent's; another agent's is answered exactly like a missing one."""
    return Confirmation.objects.filter(agent=agent, pk=confirmation_id).first()


def confirmation_for_customer(
    *, agent_id: str, customer_id: str, confirmation_id: str
) -> Confirmation | None:
    """A confirmation of this agent's for this customer (get_confirmation_status): what a model,
    bound to one customer, may ask about."""
    if not agent_id.isdigit():
        return None
    return Confirmation.objects.filter(
        agent_id=int(agent_id), customer_id=customer_id, pk=confirmation_id
    ).first()


def confirmation_summary(confirmation: Confirmation) -> str:
    """The held call in its tool's own words, for a person a host or a webhook receiver shows it
    to: "Refund order: 8000 BRL for ORD-1001"; the amount in minor units, as the API has it."""
    spec = tool_registry.get(confirmation.tool)
    if spec is None:
        return confirmation.tool
    currency, subject = held_money_of(confirmation)
    amount = confirmation.amount_cents
    money = "" if amount is None else f"{amount} {currency}".strip()
    what = " for ".join(part for part in (money, subject) if part)
    return f"{spec.title}: {what}" if what else spec.title


def confirmation_state(confirmation: Confirmation) -> dict[str, Any]:
    status = confirmation.status
    if status == ConfirmationStatus.PENDING and confirmation.expires_at <= timezone.now():
        status = ConfirmationStatus.EXPIRED
    return {
        "confirmation_id": confirmation.id,
        "status": status,
        # Nothing follows: the host stops polling (no list of statuses to keep in step).
        "final": status in CONFIRMATION_FINAL,
        "tool": confirmation.tool,
        "summary": confirmation_summary(confirmation),
        "arguments": confirmation.arguments,
        "reviewers_required": confirmation.reviewers_required,
        "policy_version": confirmation.policy_version,
        "created_at": confirmation.created_at.isoformat(),
        "expires_at": confirmation.expires_at.isoformat(),
        "decided_at": confirmation.decided_at.isoformat() if confirmation.decided_at else None,
        # Why it was held; why it was rejected or invalidated (the reviewer's or the re-check's
        # words), once it was.
        "hold_reason": confirmation.hold_reason,
        "decision_code": confirmation.decision_code or None,
        "decision_reason": confirmation.decision_reason or None,
        "finished_at": confirmation.finished_at.isoformat() if confirmation.finished_at else None,
        # The result contract, model_text included, once final.
        "result": confirmation.result,
        # A reviewer's edit: the held call it was edited from (what the model asked), or the
        # edited call that took this one's place (follow it: this one never executes).
        "edited_from": _edited_from(confirmation),
        "superseded_by": (
            Confirmation.objects.filter(edited_from=confirmation.pk)
            .values_list("pk", flat=True)
            .first()
            if status == ConfirmationStatus.SUPERSEDED
            else None
        ),
    }


def _edited_from(confirmation: Confirmation) -> dict[str, Any] | None:
    if not confirmation.edited_from:
        return None
    asked = (
        Confirmation.objects.filter(pk=confirmation.edited_from)
        .values_list("arguments", flat=True)
        .first()
    )
    return {"confirmation_id": confirmation.edited_from, "arguments": asked}

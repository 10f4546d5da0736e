"""Policy changes approved by a second person.

A change to an agent's policy (its tools, its human rules, its thresholds) or to a reviewer's
approval limit is drafted by one person and applied only when another manager approves it: the
approval inserts the new policy version and makes it the agent's current one (or sets the limit),
in one transaction. Its author cannot approve it; a settled change is never changed again (on
PostgreSQL a trigger refuses it too, whoever asks). Who drafted, approved or withdrew each change
is a policy event, chained per agent (per reviewer for limits) and sealed with the audit.

The emergency path stays one person's: disabling an agent takes effect at once, and is recorded
as that person's act alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.models import (
    PolicyChange,
    PolicyChangeKind,
    PolicyChangeStatus,
    PolicyEvent,
    PolicyEventKind,
    ReviewerLimit,
)
from approvals.reviewers import is_manager
from dispatch.audit_keys import audit_mac
from dispatch.models import Agent, Policy
from dispatch.money import major_units
from dispatch.pipeline.audit_chain import (
    POLICY_EVENT_FIELDS,
    covered,
    limits_chain,
    link_hash,
    policy_chain,
)
from dispatch.pipeline.policy import CurrencyLimits, HumanRule
from dispatch.pipeline.policy import Policy as PolicySnapshot
from dispatch.registry import tool_registry
from dispatch.services import policy_create

# The fields of a version a policy change proposes, in the order its difference lists them.
PROPOSAL_FIELDS = (
    "allowed_tools",
    "human_rules",
    "currency_limits",
    "auto_approve_window_seconds",
    "step_budget",
    "repeat_limit",
    "confirmation_ttl_seconds",
)
# The smallest value of each whole-number field (the model's validators).
_WHOLE_MINIMUM = {
    "auto_approve_window_seconds": 60,
    "step_budget": 1,
    "repeat_limit": 1,
    "confirmation_ttl_seconds": 60,
}
_THRESHOLD_WORDS = {
    "max_amount_cents": "max amount a call",
    "auto_approve_below_cents": "no human below",
    "two_reviewers_from_cents": "two reviewers from",
    "daily_cap_cents": "daily cap without a human",
    "confirm_above_cents": "approvals ask once more above",
    "factor_above_cents": "approvals need a second factor above",
}


class PolicyChangeRefused(Exception):
    """A draft or a decision refused, with its code (docs/errors-and-security-events.md) and why
    in words; nothing was applied."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


# The codes, as a security event or the page names them.
OWN_DRAFT = "policy_change_own_draft"
NOT_A_DRAFT = "policy_change_settled"
NOT_A_MANAGER = "policy_change_not_a_manager"
POLICY_MOVED = "policy_change_policy_moved"
NO_CHANGE = "policy_change_no_change"
INVALID = "policy_change_invalid"


# Proposals.


def proposal_of(policy: Policy) -> dict[str, Any]:
    """A version's fields as a proposal names them; a version made before thresholds were kept per
    currency gives its one set to each of TOOLGATE_POLICY_CURRENCIES, as policy_create does."""
    limits = policy.currency_limits
    if limits is None:
        flat = CurrencyLimits(
            policy.max_amount_cents or 0,
            policy.auto_approve_below_cents or 0,
            policy.two_reviewers_from_cents,
            policy.daily_cap_cents,
        )._asdict()
        limits = {currency: flat for currency in settings.TOOLGATE_POLICY_CURRENCIES}
    return {
        "allowed_tools": sorted(policy.allowed_tools),
        "human_rules": dict(sorted((policy.human_rules or {}).items())),
        "currency_limits": {
            currency.upper(): CurrencyLimits(**values)._asdict()
            for currency, values in sorted(limits.items())
        },
        "auto_approve_window_seconds": policy.auto_approve_window_seconds,
        "step_budget": policy.step_budget,
        "repeat_limit": policy.repeat_limit,
        "confirmation_ttl_seconds": policy.confirmation_ttl_seconds,
    }


def proposal_of_snapshot(base: Policy, snapshot: PolicySnapshot) -> dict[str, Any]:
    """The proposal a what-if's draft makes: `base` with the draft's window and thresholds."""
    proposal = proposal_of(base)
    proposal["auto_approve_window_seconds"] = snapshot.auto_approve_window_seconds
    currencies = snapshot.currencies
    if currencies is None:
        shared = snapshot.limits("")
        currencies = {currency: shared for currency in proposal["currency_limits"] if shared}
    proposal["currency_limits"] = {
        currency.upper(): limits._asdict() for currency, limits in sorted(currencies.items())
    }
    return proposal


def proposal_checked(proposal: Mapping[str, Any]) -> dict[str, Any]:
    """The proposal in its one shape, or PolicyChangeRefused naming what is wrong with it."""
    if set(proposal) != set(PROPOSAL_FIELDS):
        raise PolicyChangeRefused(INVALID, "A policy proposal gives every field of a version.")
    tools = proposal["allowed_tools"]
    if not isinstance(tools, list) or not all(isinstance(name, str) for name in tools):
        raise PolicyChangeRefused(INVALID, "allowed_tools is a list of tool names.")
    unknown = sorted(name for name in tools if tool_registry.get(name) is None)
    rules = proposal["human_rules"]
    if not isinstance(rules, dict):
        raise PolicyChangeRefused(INVALID, "human_rules maps tools to never, always or by_amount.")
    unknown += sorted(name for name in rules if tool_registry.get(name) is None)
    if unknown:
        raise PolicyChangeRefused(INVALID, f"Unknown tools: {', '.join(sorted(set(unknown)))}.")
    try:
        rules = {tool: HumanRule(rule).value for tool, rule in sorted(rules.items())}
    except ValueError:
        raise PolicyChangeRefused(INVALID, "A human rule is never, always or by_amount.") from None
    limits: dict[str, dict[str, int | None]] = {}
    for currency, values in sorted(dict(proposal["currency_limits"]).items()):
        try:
            each = CurrencyLimits(**values)
        except TypeError:
            raise PolicyChangeRefused(INVALID, f"{currency}: unknown thresholds.") from None
        for name, value in each._asdict().items():
            if value is None and name in ("max_amount_cents", "auto_approve_below_cents"):
                raise PolicyChangeRefused(INVALID, f"{currency}: {name} is needed.")
            if value is not None and (type(value) is not int or value < 0):
                raise PolicyChangeRefused(INVALID, f"{currency}: {name} is a whole amount.")
        if each.max_amount_cents < 1:
            raise PolicyChangeRefused(INVALID, f"{currency}: the max amount is more than 0.")
        limits[str(currency).upper()] = each._asdict()
    checked: dict[str, Any] = {
        "allowed_tools": sorted(set(tools)),
        "human_rules": rules,
        "currency_limits": limits,
    }
    for name, minimum in _WHOLE_MINIMUM.items():
        value = proposal[name]
        if type(value) is not int or value < minimum:
            raise PolicyChangeRefused(INVALID, f"{name} is a whole number from {minimum}.")
        checked[name] = value
    return checked


def proposal_snapshot(proposal: Mapping[str, Any], version: int) -> PolicySnapshot:
    """What the pipeline would judge by under the proposal (for the what-if)."""
    unsaved = Policy(version=version, **proposal)
    return unsaved.snapshot()


# The difference a draft makes.


@dataclass(frozen=True)
class Difference:
    what: str
    before: str
    after: str


def _money(cents: int | None, currency: str) -> str:
    return "none" if cents is None else f"{major_units(cents, currency)} {currency}"


def policy_difference(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Difference]:
    """What changes from one proposal to the other, a line a field, in a manager's words."""
    differences = []
    tools_before, tools_after = set(before["allowed_tools"]), set(after["allowed_tools"])
    for tool in sorted(tools_after - tools_before):
        differences.append(Difference(f"tool {tool}", "not allowed", "allowed"))
    for tool in sorted(tools_before - tools_after):
        differences.append(Difference(f"tool {tool}", "allowed", "not allowed"))
    rules_before, rules_after = before["human_rules"], after["human_rules"]
    default = "by amount if high risk, else never"
    for tool in sorted(set(rules_before) | set(rules_after)):
        was, now = rules_before.get(tool), rules_after.get(tool)
        if was != now:
            differences.append(
                Difference(
                    f"human for {tool}",
                    (was or default).replace("_", " "),
                    (now or default).replace("_", " "),
                )
            )
    limits_before, limits_after = before["currency_limits"], after["currency_limits"]
    for currency in sorted(set(limits_before) | set(limits_after)):
        was, now = limits_before.get(currency), limits_after.get(currency)
        if was == now:
            continue
        if was is None or now is None:
            held = "no thresholds: every call held for a human"
            differences.append(
                Difference(
                    f"{currency} thresholds",
                    held if was is None else "set",
                    held if now is None else "set",
                )
            )
        for name, words in _THRESHOLD_WORDS.items():
            old = None if was is None else was.get(name)
            new = None if now is None else now.get(name)
            if old != new:
                differences.append(
                    Difference(f"{currency} {words}", _money(old, currency), _money(new, currency))
                )
    for name in _WHOLE_MINIMUM:
        if before[name] != after[name]:
            differences.append(
                Difference(name.replace("_", " "), str(before[name]), str(after[name]))
            )
    return differences


def limit_difference(change: PolicyChange) -> list[Difference]:
    assert change.reviewer is not None
    current = ReviewerLimit.objects.filter(
        reviewer=change.reviewer, currency=change.currency
    ).first()
    before = "no limit" if current is None else _money(current.max_amount_cents, change.currency)
    cents = change.proposal.get("max_amount_cents")
    after = "no limit" if cents is None else _money(cents, change.currency)
    return [
        Difference(f"{change.reviewer.get_username()}'s limit in {change.currency}", before, after)
    ]


def change_difference(change: PolicyChange) -> list[Difference]:
    """What approving it would change now (a policy: against the version it was drafted on)."""
    if change.kind == PolicyChangeKind.LIMIT:
        return limit_difference(change)
    assert change.base_policy is not None
    return policy_difference(proposal_of(change.base_policy), change.proposal)


# The chain of who did what.


def _event_append(
    *,
    chain: str,
    kind: str,
    actor: User,
    change: PolicyChange | None,
    agent_id: int | None,
    data: Mapping[str, Any],
) -> PolicyEvent:
    """The next link of the chain. The caller holds the lock of the chain's owner (the agent's row,
    or the reviewer's), so that two events of one chain never take the same place."""
    fields = {
        "chain": chain,
        "at": timezone.now(),
        "kind": kind,
        "change_id": change.pk if change is not None else None,
        "agent_id": agent_id,
        "actor_id": actor.pk,
        "actor_label": actor.get_username(),
        "data": dict(data),
    }
    last = (
        PolicyEvent.objects.filter(chain=chain)
        .order_by("-chain_seq")
        .values_list("chain_seq", "chain_hash")
        .first()
    )
    seq, previous = last if last is not None else (0, "")
    linked = link_hash(
        chain=chain, seq=seq + 1, previous=previous, fields=covered(POLICY_EVENT_FIELDS, fields)
    )
    return PolicyEvent.objects.create(
        **fields, chain_seq=seq + 1, chain_hash=linked, chain_mac=audit_mac(linked)
    )


def _chain_of(change: PolicyChange) -> str:
    if change.kind == PolicyChangeKind.LIMIT:
        return limits_chain(change.reviewer_id or 0)
    return policy_chain(change.agent_id or 0)


def _lock_owner(change: PolicyChange) -> None:
    if change.kind == PolicyChangeKind.LIMIT:
        User.objects.select_for_update().filter(pk=change.reviewer_id or 0).first()
    else:
        Agent.objects.select_for_update().filter(pk=change.agent_id or 0).first()


# The transitions.


@transaction.atomic
def policy_change_draft(
    *, agent: Agent, proposal: Mapping[str, Any], drafted_by: User, note: str = ""
) -> PolicyChange:
    """A draft of a new version of the agent's policy, against its current version."""
    checked = proposal_checked(proposal)
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    base = locked.current_policy
    if base is None:
        raise PolicyChangeRefused(
            INVALID, f"{agent.name} has no policy yet: create_agent makes one."
        )
    if not policy_difference(proposal_of(base), checked):
        raise PolicyChangeRefused(
            NO_CHANGE, f"The draft is the policy in force (v{base.version}): nothing would change."
        )
    change = PolicyChange.objects.create(
        kind=PolicyChangeKind.POLICY,
        agent=locked,
        base_policy=base,
        proposal=checked,
        note=note.strip(),
        drafted_by=drafted_by,
        drafted_at=timezone.now(),
    )
    _event_append(
        chain=policy_chain(locked.pk),
        kind=PolicyEventKind.DRAFTED,
        actor=drafted_by,
        change=change,
        agent_id=locked.pk,
        data={"base_version": base.version, "proposal": checked},
    )
    return change


@transaction.atomic
def limit_change_draft(
    *,
    reviewer: User,
    currency: str,
    max_amount_cents: int | None,
    drafted_by: User,
    note: str = "",
) -> PolicyChange:
    """A draft of a reviewer's approval limit in one currency; None removes it (no limit)."""
    currency = currency.strip().upper()
    if not currency.isalpha() or len(currency) != 3:
        raise PolicyChangeRefused(INVALID, "A currency is its three-letter code, such as BRL.")
    if max_amount_cents is not None and (type(max_amount_cents) is not int or max_amount_cents < 0):
        raise PolicyChangeRefused(INVALID, "A limit is a whole amount, 0 or more.")
    User.objects.select_for_update().filter(pk=reviewer.pk).first()
    current = ReviewerLimit.objects.filter(reviewer=reviewer, currency=currency).first()
    if (None if current is None else current.max_amount_cents) == max_amount_cents:
        raise PolicyChangeRefused(NO_CHANGE, "That is the limit in force: nothing would change.")
    change = PolicyChange.objects.create(
        kind=PolicyChangeKind.LIMIT,
        reviewer=reviewer,
        currency=currency,
        proposal={"max_amount_cents": max_amount_cents},
        note=note.strip(),
        drafted_by=drafted_by,
        drafted_at=timezone.now(),
    )
    _event_append(
        chain=limits_chain(reviewer.pk),
        kind=PolicyEventKind.DRAFTED,
        actor=drafted_by,
        change=change,
        agent_id=None,
        data={"currency": currency, "max_amount_cents": max_amount_cents},
    )
    return change


def _locked_draft(change_id: int) -> PolicyChange:
    change = PolicyChange.objects.filter(pk=change_id).first()
    if change is None:
        raise PolicyChangeRefused(INVALID, f"There is no policy change {change_id}.")
    # The owner of its chain first, then the change: the order every transition takes.
    _lock_owner(change)
    change = PolicyChange.objects.select_for_update().get(pk=change_id)
    if change.status != PolicyChangeStatus.DRAFT:
        raise PolicyChangeRefused(
            NOT_A_DRAFT,
            f"This change was {change.status} already: a settled change stays as it is.",
        )
    return change


@transaction.atomic
def policy_change_approve(*, change_id: int, approver: User) -> PolicyChange:
    """Apply a draft: a new policy version made current, or the limit set. Refused (nothing
    applied) for its author, for anyone not a manager, for a change settled already, and for a
    policy change whose agent's policy moved since it was drafted."""
    change = _locked_draft(change_id)
    if change.drafted_by_id == approver.pk:
        raise PolicyChangeRefused(
            OWN_DRAFT, "You drafted this change: another manager must approve it."
        )
    if not is_manager(approver):
        raise PolicyChangeRefused(NOT_A_MANAGER, "Only a manager may approve a policy change.")
    now = timezone.now()
    data: dict[str, Any]
    if change.kind == PolicyChangeKind.POLICY:
        agent = Agent.objects.get(pk=change.agent_id or 0)
        if agent.current_policy_id != change.base_policy_id:
            raise PolicyChangeRefused(
                POLICY_MOVED,
                "The agent's policy changed since this was drafted: withdraw it and draft again "
                "against the version in force.",
            )
        proposal = change.proposal
        created = policy_create(
            agent=agent,
            allowed_tools=proposal["allowed_tools"],
            currencies={
                currency: CurrencyLimits(**values)
                for currency, values in proposal["currency_limits"].items()
            },
            humans=proposal["human_rules"],
            auto_approve_window_seconds=proposal["auto_approve_window_seconds"],
            step_budget=proposal["step_budget"],
            repeat_limit=proposal["repeat_limit"],
            confirmation_ttl_seconds=proposal["confirmation_ttl_seconds"],
            created_by=change.drafted_by,
        )
        change.policy = created
        data = {"version": created.version, "drafted_by": change.drafted_by.get_username()}
    else:
        cents = change.proposal.get("max_amount_cents")
        if cents is None:
            ReviewerLimit.objects.filter(
                reviewer_id=change.reviewer_id, currency=change.currency
            ).delete()
        else:
            ReviewerLimit.objects.update_or_create(
                reviewer_id=change.reviewer_id,
                currency=change.currency,
                defaults={"max_amount_cents": cents},
            )
        data = {
            "currency": change.currency,
            "max_amount_cents": cents,
            "drafted_by": change.drafted_by.get_username(),
        }
    change.status = PolicyChangeStatus.APPROVED
    change.decided_by = approver
    change.decided_at = now
    change.save(update_fields=["status", "decided_by", "decided_at", "policy"])
    _event_append(
        chain=_chain_of(change),
        kind=PolicyEventKind.APPROVED,
        actor=approver,
        change=change,
        agent_id=change.agent_id,
        data=data,
    )
    return change


@transaction.atomic
def policy_change_withdraw(*, change_id: int, user: User) -> PolicyChange:
    """Its author, or a manager, withdraws a draft: nothing is applied, and it stays on record."""
    change = _locked_draft(change_id)
    if change.drafted_by_id != user.pk and not is_manager(user):
        raise PolicyChangeRefused(
            NOT_A_MANAGER, "Only its author or a manager may withdraw a policy change."
        )
    change.status = PolicyChangeStatus.WITHDRAWN
    change.decided_by = user
    change.decided_at = timezone.now()
    change.save(update_fields=["status", "decided_by", "decided_at"])
    _event_append(
        chain=_chain_of(change),
        kind=PolicyEventKind.WITHDRAWN,
        actor=user,
        change=change,
        agent_id=change.agent_id,
        data={},
    )
    return change


@transaction.atomic
def agent_active_set(*, agent: Agent, active: bool, actor: User, reason: str = "") -> bool:
    """The emergency path: one person disables an agent (its token stops working at once), or
    enables it again; recorded in the agent's chain as that person's act alone. False if it was
    already so."""
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    if locked.is_active == active:
        return False
    locked.is_active = active
    locked.save(update_fields=["is_active"])
    agent.is_active = active
    _event_append(
        chain=policy_chain(locked.pk),
        kind=PolicyEventKind.ENABLED if active else PolicyEventKind.DISABLED,
        actor=actor,
        change=None,
        agent_id=locked.pk,
        data={"alone": True, "reason": reason.strip()},
    )
    return True

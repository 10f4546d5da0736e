"""Policy changes approved by a second person (approvals/policy_changes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from analytics.permissions import MANAGERS_GROUP
from approvals.chains import policy_events
from approvals.models import (
    PolicyChange,
    PolicyChangeStatus,
    PolicyEvent,
    PolicyEventKind,
    ReviewerLimit,
)
from approvals.policy_changes import (
    NO_CHANGE,
    NOT_A_DRAFT,
    NOT_A_MANAGER,
    OWN_DRAFT,
    POLICY_MOVED,
    PolicyChangeRefused,
    agent_active_set,
    change_difference,
    limit_change_draft,
    policy_change_approve,
    policy_change_draft,
    policy_change_withdraw,
    proposal_of,
)
from dispatch.audit import audit_verify
from dispatch.models import Agent
from dispatch.pipeline.audit_chain import policy_chain
from tests.approvals.conftest import MakeUser
from tests.conftest import MakeAgent

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the policy change's trigger is PostgreSQL's"
)


@pytest.fixture
def managers(make_user: MakeUser) -> tuple[User, User]:
    return make_user("ana", MANAGERS_GROUP), make_user("bruno", MANAGERS_GROUP)


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent("payments")[0]


def _looser(agent: Agent) -> dict[str, Any]:
    assert agent.current_policy is not None
    proposal = proposal_of(agent.current_policy)
    for limits in proposal["currency_limits"].values():
        limits["auto_approve_below_cents"] = limits["max_amount_cents"]
    proposal["step_budget"] += 10
    return proposal


def test_a_draft_changes_nothing_until_another_manager_approves_it(
    agent: Agent, managers: tuple[User, User]
) -> None:
    author, approver = managers
    before = agent.current_policy

    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)
    agent.refresh_from_db()
    assert agent.current_policy == before
    assert any(line.what == "step budget" for line in change_difference(change))

    approved = policy_change_approve(change_id=change.pk, approver=approver)

    agent.refresh_from_db()
    assert approved.status == PolicyChangeStatus.APPROVED
    assert agent.current_policy == approved.policy
    assert agent.current_policy is not None and before is not None
    assert agent.current_policy.version == before.version + 1
    assert agent.current_policy.step_budget == before.step_budget + 10
    kinds = list(
        PolicyEvent.objects.filter(chain=policy_chain(agent.pk)).values_list(
            "kind", "actor_label", "chain_seq"
        )
    )
    assert kinds == [(PolicyEventKind.DRAFTED, "ana", 1), (PolicyEventKind.APPROVED, "bruno", 2)]


def test_it_refuses_the_author_approving_their_own_draft(
    agent: Agent, managers: tuple[User, User]
) -> None:
    author, _ = managers
    before = agent.current_policy
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_approve(change_id=change.pk, approver=author)

    assert refused.value.code == OWN_DRAFT
    agent.refresh_from_db()
    assert agent.current_policy == before
    assert PolicyChange.objects.get(pk=change.pk).status == PolicyChangeStatus.DRAFT


def test_it_refuses_an_approver_who_is_not_a_manager(
    agent: Agent, managers: tuple[User, User], make_user: MakeUser
) -> None:
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=managers[0])
    outsider = make_user("olga", is_staff=True, is_superuser=True)

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_approve(change_id=change.pk, approver=outsider)

    assert refused.value.code == NOT_A_MANAGER
    assert agent.policies.count() == 1


def test_a_settled_change_is_never_approved_again(
    agent: Agent, managers: tuple[User, User], make_user: MakeUser
) -> None:
    author, approver = managers
    third = make_user("carla", MANAGERS_GROUP)
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)
    policy_change_approve(change_id=change.pk, approver=approver)

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_approve(change_id=change.pk, approver=third)

    assert refused.value.code == NOT_A_DRAFT
    assert agent.policies.count() == 2


def test_a_withdrawn_draft_is_not_applied(agent: Agent, managers: tuple[User, User]) -> None:
    author, approver = managers
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)
    policy_change_withdraw(change_id=change.pk, user=author)

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_approve(change_id=change.pk, approver=approver)

    assert refused.value.code == NOT_A_DRAFT
    assert agent.policies.count() == 1


def test_a_draft_of_a_policy_that_moved_since_is_refused(
    agent: Agent, managers: tuple[User, User]
) -> None:
    author, approver = managers
    first = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)
    stricter = _looser(agent)
    stricter["repeat_limit"] = 1
    second = policy_change_draft(agent=agent, proposal=stricter, drafted_by=author)
    policy_change_approve(change_id=first.pk, approver=approver)

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_approve(change_id=second.pk, approver=approver)

    assert refused.value.code == POLICY_MOVED
    assert agent.policies.count() == 2


def test_a_draft_that_changes_nothing_is_refused(agent: Agent, managers: tuple[User, User]) -> None:
    assert agent.current_policy is not None

    with pytest.raises(PolicyChangeRefused) as refused:
        policy_change_draft(
            agent=agent, proposal=proposal_of(agent.current_policy), drafted_by=managers[0]
        )

    assert refused.value.code == NO_CHANGE
    assert not PolicyChange.objects.exists()


def test_a_reviewers_limit_changes_the_same_way(
    managers: tuple[User, User], make_user: MakeUser
) -> None:
    author, approver = managers
    rita = make_user("rita")
    change = limit_change_draft(
        reviewer=rita, currency="brl", max_amount_cents=20_000, drafted_by=author
    )
    assert not ReviewerLimit.objects.filter(reviewer=rita).exists()
    with pytest.raises(PolicyChangeRefused):
        policy_change_approve(change_id=change.pk, approver=author)

    policy_change_approve(change_id=change.pk, approver=approver)

    limit = ReviewerLimit.objects.get(reviewer=rita)
    assert (limit.currency, limit.max_amount_cents) == ("BRL", 20_000)
    removal = limit_change_draft(
        reviewer=rita, currency="BRL", max_amount_cents=None, drafted_by=approver
    )
    policy_change_approve(change_id=removal.pk, approver=author)
    assert not ReviewerLimit.objects.filter(reviewer=rita).exists()


def test_the_emergency_stop_is_one_persons_and_recorded_as_such(
    agent: Agent, managers: tuple[User, User]
) -> None:
    stopped = agent_active_set(agent=agent, active=False, actor=managers[0], reason="leaking")

    agent.refresh_from_db()
    assert stopped and not agent.is_active
    event = PolicyEvent.objects.get(chain=policy_chain(agent.pk))
    assert (event.kind, event.actor_label, event.data) == (
        PolicyEventKind.DISABLED,
        "ana",
        {"alone": True, "reason": "leaking"},
    )


def test_the_policy_events_chain_verifies_and_a_rewrite_is_found(
    agent: Agent, managers: tuple[User, User]
) -> None:
    author, approver = managers
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)
    policy_change_approve(change_id=change.pk, approver=approver)
    assert policy_events.count() == 2
    assert [f for f in audit_verify().findings if f.chain.startswith("policy:")] == []

    PolicyEvent.objects.filter(kind=PolicyEventKind.APPROVED).update(actor_label="ana")

    assert [f for f in audit_verify().findings if f.chain.startswith("policy:")] != []


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_to_edit_a_settled_change_or_self_approve(
    make_agent: MakeAgent, make_user: MakeUser
) -> None:
    agent = make_agent("guarded")[0]
    author = make_user("ana", MANAGERS_GROUP)
    approver = make_user("bruno", MANAGERS_GROUP)
    change = policy_change_draft(agent=agent, proposal=_looser(agent), drafted_by=author)

    with pytest.raises(DatabaseError, match="is not edited"), transaction.atomic():
        PolicyChange.objects.filter(pk=change.pk).update(note="changed")
    with pytest.raises(DatabaseError, match="another than its author"), transaction.atomic():
        PolicyChange.objects.filter(pk=change.pk).update(
            status=PolicyChangeStatus.APPROVED, decided_by=author
        )
    policy_change_approve(change_id=change.pk, approver=approver)
    with pytest.raises(DatabaseError, match="stays as it is"), transaction.atomic():
        PolicyChange.objects.filter(pk=change.pk).update(proposal={})

    settled = PolicyChange.objects.get(pk=change.pk)
    assert (settled.status, settled.note, settled.decided_by) == ("approved", "", approver)

"""A token's lookup reads, in its one statement, what the ORM's select_related query reads."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Model

from dispatch.models import Agent
from dispatch.services import agent_authenticate
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db


def fields_of(instance: Model) -> dict[str, Any]:
    return {
        field.attname: getattr(instance, field.attname) for field in instance._meta.concrete_fields
    }


def test_the_agent_and_its_policy_are_the_orms_field_for_field_in_one_statement(
    make_agent: MakeAgent, django_assert_num_queries: Any
) -> None:
    agent, token = make_agent(
        humans={"refund_order": "always"}, daily_cap_cents=90_000, confirm_above_cents=30_000
    )
    Agent.objects.filter(pk=agent.pk).update(webhook_url="https://hooks.example.com/tg")
    expected = Agent.objects.select_related("current_policy").get(pk=agent.pk)

    with django_assert_num_queries(1):
        found = agent_authenticate(token)
        assert found is not None
        policy = found.current_policy  # read with the agent: no second statement

    assert fields_of(found) == fields_of(expected)
    assert policy is not None and expected.current_policy is not None
    assert fields_of(policy) == fields_of(expected.current_policy)
    # The JSON columns come back as the ORM gives them, not as text.
    assert policy.allowed_tools == ["get_order", "refund_order"]
    assert policy.human_rules == {"refund_order": "always"}
    assert isinstance(policy.currency_limits, dict)
    assert found._state.adding is False and policy._state.adding is False


def test_an_agent_without_a_policy_is_found_with_none(
    make_agent: MakeAgent, django_assert_num_queries: Any
) -> None:
    agent, token = make_agent()
    Agent.objects.filter(pk=agent.pk).update(current_policy=None)

    with django_assert_num_queries(1):
        found = agent_authenticate(token)
        assert found is not None and found.pk == agent.pk
        assert found.current_policy is None


def test_a_disabled_agent_or_an_unknown_token_finds_no_one(make_agent: MakeAgent) -> None:
    agent, token = make_agent()
    assert agent_authenticate(token + "x") is None
    assert agent_authenticate("") is None
    Agent.objects.filter(pk=agent.pk).update(is_active=False)
    assert agent_authenticate(token) is None

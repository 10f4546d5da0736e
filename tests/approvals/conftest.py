"""Reviewers, and refunds held by the real pipeline, for the reviewer pages' tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from approvals.selectors import MANAGERS_GROUP, REVIEWERS_GROUP
from dispatch.models import Agent, Confirmation
from dispatch.services import call_dispatch
from orders.models import Order

_sessions = itertools.count(1)

MakeUser = Callable[..., User]
HoldRefund = Callable[..., Confirmation]


@pytest.fixture
def make_user(db: None) -> MakeUser:
    """A user in the given groups (none by default), with the password `pw`."""

    def make(username: str, *groups: str, **fields: Any) -> User:
        user = User.objects.create_user(username, password="pw", **fields)
        for name in groups:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
        return user

    return make


@pytest.fixture
def reviewer(make_user: MakeUser) -> User:
    return make_user("rita", REVIEWERS_GROUP)


@pytest.fixture
def manager(make_user: MakeUser) -> User:
    return make_user("max", MANAGERS_GROUP, is_staff=True)


@pytest.fixture
def hold_refund(agent: tuple[Agent, str], orders: dict[str, Order]) -> HoldRefund:
    """A refund the pipeline held for a human (5000 or more under the tests' policy)."""

    def hold(
        amount_cents: int = 6_000,
        *,
        order_id: str = "ORD-1001",
        currency: str = "BRL",
        customer_id: str = "CUS-1",
        session_id: str | None = None,
        reason: str = "damaged",
    ) -> Confirmation:
        result = call_dispatch(
            agent=agent[0],
            session_id=session_id or f"s-{next(_sessions)}",
            customer_id=customer_id,
            tool="refund_order",
            arguments={
                "order_id": order_id,
                "amount_cents": amount_cents,
                "currency": currency,
                "reason": reason,
            },
        )
        assert result.code == "CONFIRMATION_REQUIRED", result
        return Confirmation.objects.get(pk=result.data["confirmation_id"])

    return hold

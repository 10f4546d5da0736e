"""The records pages' fixtures: users by role, refunds held by the real pipeline (the reviewer
pages' fixtures), and an order's books: refunds by the policy and by a reviewer, and one held."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.services import confirmation_approve
from dispatch.models import Agent, Confirmation
from dispatch.services import call_dispatch
from orders.models import Order
from tests.approvals import conftest as approvals
from tests.approvals.conftest import HoldRefund

# The reviewer pages' fixtures, shared.
hold_refund = approvals.hold_refund
holding_agent = approvals.holding_agent
make_user = approvals.make_user
manager = approvals.manager
reviewer = approvals.reviewer

Commits = Callable[..., AbstractContextManager[Any]]


@dataclass
class Books:
    """ORD-1001 (CUS-1, R$ 120,00): R$ 20,00 refunded by the policy, R$ 50,00 by rita, R$ 50,00
    held and pending; ORD-1002 (CUS-2, $45.00): nothing."""

    agent: Agent
    approved: Confirmation
    pending: Confirmation


@pytest.fixture
def books(
    hold_refund: HoldRefund,
    holding_agent: Agent,
    reviewer: User,
    django_capture_on_commit_callbacks: Commits,
) -> Books:
    auto = call_dispatch(
        agent=holding_agent,
        session_id="s-auto",
        customer_id="CUS-1",
        tool="refund_order",
        arguments={
            "order_id": "ORD-1001",
            "amount_cents": 2_000,
            "currency": "BRL",
            "reason": "not_delivered",
        },
    )
    assert auto.code == "OK", auto
    approved = hold_refund(5_000)
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=approved.pk, reviewer=reviewer)
    pending = hold_refund(5_000, reason="customer_request")
    order = Order.objects.get(order_id="ORD-1001")
    assert order.refunded_cents == 7_000
    return Books(holding_agent, Confirmation.objects.get(pk=approved.pk), pending)


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def refused(client: Client, times: int, token: str = "nope", address: str = "203.0.113.7") -> None:
    for _ in range(times):
        response = client.post(
            "/api/v1/calls",
            "{}",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Token {token}",
            REMOTE_ADDR=address,
        )
        assert response.status_code == 401

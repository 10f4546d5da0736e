"""Amounts in every currency's own minor units: a JPY order counts whole yen, a KWD order
thousandths of a dinar; each is held by its currency's thresholds and shown as people write it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from dispatch.models import Confirmation
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import call_dispatch
from orders.models import Refund
from tests.conftest import MakeAgent
from tests.factories import OrderFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(make_agent: MakeAgent) -> object:
    return make_agent(
        currencies={
            # ¥2,000 without a human, two reviewers from ¥30,000.
            "JPY": CurrencyLimits(100_000, 2_000, 30_000, None),
            # 5.000 KWD without a human.
            "KWD": CurrencyLimits(100_000, 5_000, None, None),
        }
    )[0]


def refund(agent: object, order_id: str, amount: int, currency: str) -> dict[str, object]:
    return call_dispatch(
        agent=agent,  # type: ignore[arg-type]
        session_id=f"s-{order_id}",
        customer_id="CUS-9",
        tool="refund_order",
        arguments={
            "order_id": order_id,
            "amount_cents": amount,
            "currency": currency,
            "reason": "damaged",
        },
    ).as_dict()


def test_a_yen_and_a_dinar_refund_are_judged_in_their_own_units(agent: object) -> None:
    OrderFactory.create(
        order_id="ORD-8101", customer_id="CUS-9", total_cents=50_000, currency="JPY"
    )
    OrderFactory.create(
        order_id="ORD-8102", customer_id="CUS-9", total_cents=90_000, currency="KWD"
    )

    small_yen = refund(agent, "ORD-8101", 1_500, "JPY")
    large_yen = refund(agent, "ORD-8101", 35_000, "JPY")
    dinars = refund(agent, "ORD-8102", 12_500, "KWD")

    assert small_yen["code"] == "OK"
    assert large_yen["code"] == dinars["code"] == "CONFIRMATION_REQUIRED"
    assert large_yen["data"]["reviewers_required"] == 2  # type: ignore[index]
    assert list(Refund.objects.values_list("amount_cents", "currency")) == [(1_500, "JPY")]


def test_the_reviewer_reads_yen_and_dinars_as_people_write_them(
    agent: object, client: Client
) -> None:
    OrderFactory.create(
        order_id="ORD-8101", customer_id="CUS-9", total_cents=50_000, currency="JPY"
    )
    OrderFactory.create(
        order_id="ORD-8102", customer_id="CUS-9", total_cents=90_000, currency="KWD"
    )
    yen = refund(agent, "ORD-8101", 15_000, "JPY")
    dinars = refund(agent, "ORD-8102", 12_500, "KWD")
    reviewer = User.objects.create_user("rita")
    reviewer.groups.create(name="reviewers")
    client.force_login(reviewer)

    yen_page = client.get(
        reverse("approvals:detail", args=[yen["data"]["confirmation_id"]])  # type: ignore[index]
    ).content.decode()
    dinar_page = client.get(
        reverse("approvals:detail", args=[dinars["data"]["confirmation_id"]])  # type: ignore[index]
    ).content.decode()

    assert "¥15,000" in yen_page and "¥50,000" in yen_page
    assert "KWD\xa012.500" in dinar_page and "KWD\xa090.000" in dinar_page
    assert Confirmation.objects.filter(currency__in=["JPY", "KWD"]).count() == 2


def test_a_currency_the_policy_sets_nothing_for_is_held_for_a_human(agent: object) -> None:
    OrderFactory.create(order_id="ORD-8103", customer_id="CUS-9", total_cents=9_000)

    brl = refund(agent, "ORD-8103", 100, "BRL")

    assert brl["code"] == "CONFIRMATION_REQUIRED"
    assert brl["data"]["reason"]["kind"] == "no_thresholds"  # type: ignore[index]
    assert not Refund.objects.exists()

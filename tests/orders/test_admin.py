from __future__ import annotations

import pytest
from django.test import Client

from orders.gateway import OrmOrderBook
from orders.models import GatewayFault, Order, Refund
from orders.services import gateway_faults_set

pytestmark = pytest.mark.django_db


def test_an_order_page_lists_its_refunds_read_only(
    admin_client: Client, order: Order, book: OrmOrderBook
) -> None:
    book.refund(
        customer_id="CUS-1",
        order_id="ORD-1001",
        amount_cents=2590,
        currency="BRL",
        reason="damaged",
        key="key-admin",
        approved_by=("ana",),
    )

    response = admin_client.get(f"/admin/orders/order/{order.pk}/change/")

    assert response.status_code == 200
    assert b"key-admin" in response.content
    assert b'name="refunded_cents"' not in response.content
    assert b'name="refunds-0-amount_cents"' not in response.content


def test_the_order_list_searches_by_customer(admin_client: Client, order: Order) -> None:
    response = admin_client.get("/admin/orders/order/", {"q": "CUS-1"})

    assert response.status_code == 200
    assert b"ORD-1001" in response.content


def test_the_ledger_cannot_be_written_from_the_admin(
    admin_client: Client, order: Order, book: OrmOrderBook
) -> None:
    book.refund(
        customer_id="CUS-1",
        order_id="ORD-1001",
        amount_cents=1000,
        currency="BRL",
        reason="damaged",
        key="key-1",
        approved_by=("ana",),
    )
    refund = Refund.objects.get()

    assert admin_client.get("/admin/orders/refund/").status_code == 200
    assert admin_client.get("/admin/orders/refund/add/").status_code == 403
    response = admin_client.post(f"/admin/orders/refund/{refund.pk}/change/", {"amount_cents": 1})
    assert response.status_code == 403
    assert admin_client.post(f"/admin/orders/refund/{refund.pk}/delete/").status_code == 403
    refund.refresh_from_db()
    assert refund.amount_cents == 1000


def test_the_gateway_fault_switch_is_edited_in_place_and_never_deleted(
    admin_client: Client,
) -> None:
    gateway_faults_set()

    response = admin_client.post(
        "/admin/orders/gatewayfault/1/change/",
        {"fail_before_commit": 2, "lose_response_after_commit": 1},
    )

    assert response.status_code == 302
    fault = GatewayFault.objects.get()
    assert (fault.fail_before_commit, fault.lose_response_after_commit) == (2, 1)
    assert admin_client.get("/admin/orders/gatewayfault/add/").status_code == 403
    assert admin_client.post("/admin/orders/gatewayfault/1/delete/").status_code == 403
    assert GatewayFault.objects.count() == 1


def test_the_gateway_fault_switch_can_be_created_once(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/orders/gatewayfault/add/",
        {"fail_before_commit": 1, "lose_response_after_commit": 0},
    )

    assert response.status_code == 302
    assert GatewayFault.objects.get().pk == 1

from __future__ import annotations

import pytest
from django.db.models.signals import post_init
from django.test import Client
from pytest_django import Settings

from orders.gateway import OrmOrderBook
from orders.models import GatewayFault, Order, Refund
from orders.services import gateway_faults_set
from tests.orders.conftest import RefundCall

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


# Once money moved, an order's customer, currency and total are what the ledger refers to -------


def _change_form(order: Order, **changes: object) -> dict[str, object]:
    """The order's change form as the admin posts it, with the given fields changed."""
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "total_cents": order.total_cents,
        "currency": order.currency,
        "refunds-TOTAL_FORMS": 0,
        "refunds-INITIAL_FORMS": 0,
        **changes,
    }


def _row(order: Order) -> tuple[str, str, int, int]:
    order.refresh_from_db()
    return (order.customer_id, order.currency, order.total_cents, order.refunded_cents)


def test_an_order_with_a_refund_shows_its_customer_currency_and_total_read_only(
    admin_client: Client, order: Order, refund: RefundCall
) -> None:
    refund(amount_cents=2590)

    response = admin_client.get(f"/admin/orders/order/{order.pk}/change/")

    assert response.status_code == 200
    for name in ("customer_id", "currency", "total_cents"):
        assert f'name="{name}"'.encode() not in response.content


def test_it_keeps_the_customer_of_an_order_with_a_refund(
    admin_client: Client, order: Order, refund: RefundCall
) -> None:
    refund(amount_cents=2590)

    response = admin_client.post(
        f"/admin/orders/order/{order.pk}/change/", _change_form(order, customer_id="CUS-9")
    )

    assert response.status_code == 302
    assert _row(order) == ("CUS-1", "BRL", 12_000, 2590)


def test_a_total_below_the_refunded_amount_is_not_a_server_error(
    admin_client: Client, order: Order, refund: RefundCall
) -> None:
    refund(amount_cents=2590)

    response = admin_client.post(
        f"/admin/orders/order/{order.pk}/change/", _change_form(order, total_cents=1000)
    )

    assert response.status_code == 302
    assert _row(order) == ("CUS-1", "BRL", 12_000, 2590)


def test_a_total_below_a_refund_that_lands_while_the_form_is_handled_is_a_form_error(
    admin_client: Client, order: Order, refund: RefundCall
) -> None:
    # The admin loads the order before the refund commits (as it would when a refund and an edit
    # race): its form still offers the total, and the check must read the order as it is now.
    landed: list[bool] = []

    def refund_meanwhile(sender: type[Order], instance: Order, **kwargs: object) -> None:
        if not landed:
            landed.append(True)
            refund(amount_cents=2590)

    post_init.connect(refund_meanwhile, sender=Order)
    try:
        response = admin_client.post(
            f"/admin/orders/order/{order.pk}/change/", _change_form(order, total_cents=1000)
        )
    finally:
        post_init.disconnect(refund_meanwhile, sender=Order)

    assert response.status_code == 200
    assert b"already refunded" in response.content
    assert _row(order) == ("CUS-1", "BRL", 12_000, 2590)


def test_an_order_without_refunds_can_still_be_corrected(
    admin_client: Client, order: Order
) -> None:
    response = admin_client.post(
        f"/admin/orders/order/{order.pk}/change/",
        _change_form(order, customer_id="CUS-2", total_cents=15_000),
    )

    assert response.status_code == 302
    assert _row(order) == ("CUS-2", "BRL", 15_000, 0)


def test_a_total_of_zero_is_a_form_error(admin_client: Client, order: Order) -> None:
    response = admin_client.post(
        f"/admin/orders/order/{order.pk}/change/", _change_form(order, total_cents=0)
    )

    assert response.status_code == 200
    assert b"errorlist" in response.content
    assert _row(order) == ("CUS-1", "BRL", 12_000, 0)


# The gateway-fault switch exists only where the gateway reads it ------------------------------


def test_the_gateway_fault_switch_is_hidden_where_faults_are_disabled(
    admin_client: Client, settings: Settings
) -> None:
    gateway_faults_set()
    settings.TOOLGATE_GATEWAY_FAULTS = False

    index = admin_client.get("/admin/")
    listing = admin_client.get("/admin/orders/gatewayfault/")
    edit = admin_client.post(
        "/admin/orders/gatewayfault/1/change/",
        {"fail_before_commit": 5, "lose_response_after_commit": 5},
    )

    assert index.status_code == 200
    assert b"/admin/orders/gatewayfault/" not in index.content
    assert (listing.status_code, edit.status_code) == (403, 403)
    fault = GatewayFault.objects.get()
    assert (fault.fail_before_commit, fault.lose_response_after_commit) == (0, 0)


def test_the_gateway_fault_switch_is_listed_where_faults_are_enabled(
    admin_client: Client, settings: Settings
) -> None:
    settings.TOOLGATE_GATEWAY_FAULTS = True

    index = admin_client.get("/admin/")

    assert b"/admin/orders/gatewayfault/" in index.content

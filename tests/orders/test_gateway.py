"""The refund gateway on the database: scoping, idempotency by key, refusals and faults."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings

from dispatch.pipeline.tools import ExecutionContext, OutcomeUnknownError, Refused, TransientError
from dispatch.registry import tool_registry
from orders.book import OrderView, RefundReceipt, RefundRefused
from orders.gateway import OrmOrderBook
from orders.models import GatewayFault, Order, Refund
from orders.services import gateway_faults_set
from orders.tools import RefundOrderArguments
from tests.factories import OrderFactory
from tests.orders.conftest import RefundCall

pytestmark = pytest.mark.django_db


def ledger(order: Order) -> list[tuple[str, int]]:
    return list(order.refunds.order_by("pk").values_list("idempotency_key", "amount_cents"))


def refunded_cents(order: Order) -> int:
    order.refresh_from_db(fields=["refunded_cents"])
    return order.refunded_cents


# find ----------------------------------------------------------------------------------------


def test_find_returns_the_customers_order_in_one_query(
    book: OrmOrderBook, order: Order, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    with django_assert_num_queries(1):
        found = book.find(customer_id="CUS-1", order_id="ORD-1001")

    assert found is not None and found.placed_at == order.created_at
    assert found._replace(placed_at=None) == OrderView("ORD-1001", "CUS-1", 12_000, "BRL", 0)


def test_find_answers_another_customers_order_like_a_missing_one(
    book: OrmOrderBook, order: Order
) -> None:
    OrderFactory.create(order_id="ORD-1002", customer_id="CUS-2")

    assert book.find(customer_id="CUS-1", order_id="ORD-1002") is None
    assert book.find(customer_id="CUS-1", order_id="ORD-9999") is None
    assert book.find(customer_id="CUS-2", order_id="ORD-1001") is None


# refund ------------------------------------------------------------------------------------


def test_a_refund_moves_the_money_and_writes_one_ledger_row(
    refund: RefundCall, order: Order
) -> None:
    receipt = refund(amount_cents=2590, reason="not_delivered", approved_by=("ana", "bruno"))

    row = Refund.objects.get()
    assert receipt == RefundReceipt(
        refund_id=f"RF-{row.pk}",
        order_id="ORD-1001",
        amount_cents=2590,
        currency="BRL",
        refunded_cents=2590,
        total_cents=12_000,
    )
    assert (row.order_id, row.idempotency_key, row.amount_cents, row.currency) == (
        order.pk,
        "key-1",
        2590,
        "BRL",
    )
    assert (row.reason, row.approval, row.approved_by, row.refunded_cents_after) == (
        "not_delivered",
        "reviewer",
        "ana, bruno",
        2590,
    )
    assert refunded_cents(order) == 2590


def test_refunds_with_different_keys_add_up(refund: RefundCall, order: Order) -> None:
    first = refund(amount_cents=1000, key="key-1")
    second = refund(amount_cents=500, key="key-2")

    assert (first.refunded_cents, second.refunded_cents) == (1000, 1500)
    assert first.refund_id != second.refund_id
    assert ledger(order) == [("key-1", 1000), ("key-2", 500)]
    assert refunded_cents(order) == 1500


def test_a_refund_may_take_exactly_what_is_left(refund: RefundCall, order: Order) -> None:
    receipt = refund(amount_cents=12_000)

    assert receipt.refunded_cents == receipt.total_cents == 12_000
    assert refunded_cents(order) == 12_000


def test_a_repeated_key_returns_the_first_receipt_and_moves_no_money(
    refund: RefundCall, order: Order
) -> None:
    first = refund(amount_cents=1000, key="key-1")
    refund(amount_cents=300, key="key-2")

    # Whatever the repeat says, and however the order moved since, the key's answer is fixed.
    again = refund(amount_cents=9999, reason="customer_request", key="key-1")

    assert again == first
    assert again.refunded_cents == 1000
    assert ledger(order) == [("key-1", 1000), ("key-2", 300)]
    assert refunded_cents(order) == 1300


@pytest.mark.parametrize(
    ("overrides", "reason", "refused_with_order"),
    [
        ({"order_id": "ORD-9999"}, RefundRefused.NOT_FOUND, False),
        ({"customer_id": "CUS-2"}, RefundRefused.NOT_FOUND, False),
        ({"currency": "USD"}, RefundRefused.CURRENCY_MISMATCH, True),
        ({"amount_cents": 12_001}, RefundRefused.EXCEEDS_REFUNDABLE, True),
    ],
)
def test_a_refused_refund_writes_nothing(
    refund: RefundCall,
    order: Order,
    overrides: dict[str, Any],
    reason: str,
    refused_with_order: bool,
) -> None:
    with pytest.raises(RefundRefused) as excinfo:
        refund(**overrides)

    assert excinfo.value.reason == reason
    assert (excinfo.value.order is not None) is refused_with_order
    assert not Refund.objects.exists()
    assert refunded_cents(order) == 0


def test_a_refund_above_what_is_left_is_refused_with_the_live_order(
    refund: RefundCall, order: Order
) -> None:
    refund(amount_cents=11_500, key="key-1")

    with pytest.raises(RefundRefused) as excinfo:
        refund(amount_cents=501, key="key-2")

    assert excinfo.value.reason == RefundRefused.EXCEEDS_REFUNDABLE
    assert excinfo.value.order is not None
    assert excinfo.value.order._replace(placed_at=None) == OrderView(
        "ORD-1001", "CUS-1", 12_000, "BRL", 11_500
    )
    assert ledger(order) == [("key-1", 11_500)]
    assert refunded_cents(order) == 11_500


def test_a_twin_that_committed_first_answers_and_our_update_is_rolled_back(
    book: OrmOrderBook, refund: RefundCall, order: Order, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = refund(amount_cents=1000, key="key-1")
    # As if a concurrent call with the same key committed between our lookup and our insert.
    real_lookup = book.receipt_for_key
    lookups: list[str] = []

    def lookup_missing_the_twin_once(key: str) -> RefundReceipt | None:
        lookups.append(key)
        return None if len(lookups) == 1 else real_lookup(key)

    monkeypatch.setattr(book, "receipt_for_key", lookup_missing_the_twin_once)

    again = refund(amount_cents=1000, key="key-1")

    assert again == first
    assert lookups == ["key-1", "key-1"]
    assert ledger(order) == [("key-1", 1000)]
    assert refunded_cents(order) == 1000


# faults ------------------------------------------------------------------------------------


def test_a_transient_fault_raises_and_writes_nothing(refund: RefundCall, order: Order) -> None:
    gateway_faults_set(fail_before_commit=1)

    with pytest.raises(TransientError):
        refund(amount_cents=1000)

    assert not Refund.objects.exists()
    assert refunded_cents(order) == 0
    assert GatewayFault.objects.get().fail_before_commit == 0

    receipt = refund(amount_cents=1000)

    assert receipt.refunded_cents == 1000
    assert ledger(order) == [("key-1", 1000)]


def test_a_lost_response_commits_once_and_the_retry_gets_the_receipt(
    refund: RefundCall, order: Order
) -> None:
    gateway_faults_set(lose_response_after_commit=1)

    with pytest.raises(OutcomeUnknownError):
        refund(amount_cents=1000)

    assert ledger(order) == [("key-1", 1000)]
    assert refunded_cents(order) == 1000
    assert GatewayFault.objects.get().lose_response_after_commit == 0

    receipt = refund(amount_cents=1000)

    assert receipt.refunded_cents == 1000
    assert receipt.refund_id == f"RF-{Refund.objects.get().pk}"
    assert ledger(order) == [("key-1", 1000)]
    assert refunded_cents(order) == 1000


def test_a_response_can_be_lost_on_a_replay_too(refund: RefundCall, order: Order) -> None:
    first = refund(amount_cents=1000)
    gateway_faults_set(lose_response_after_commit=1)

    with pytest.raises(OutcomeUnknownError):
        refund(amount_cents=1000)

    assert refund(amount_cents=1000) == first
    assert ledger(order) == [("key-1", 1000)]


def test_a_refused_refund_consumes_no_lost_response_fault(refund: RefundCall, order: Order) -> None:
    gateway_faults_set(lose_response_after_commit=1)

    with pytest.raises(RefundRefused):
        refund(amount_cents=12_001)

    assert GatewayFault.objects.get().lose_response_after_commit == 1
    assert not Refund.objects.exists()


def test_with_faults_switched_off_the_gateway_never_reads_the_switch(
    refund: RefundCall, order: Order, settings: Settings
) -> None:
    gateway_faults_set(fail_before_commit=1, lose_response_after_commit=1)
    settings.TOOLGATE_GATEWAY_FAULTS = False

    with CaptureQueriesContext(connection) as queries:
        receipt = refund(amount_cents=1000)

    assert receipt.refunded_cents == 1000
    assert not [q for q in queries.captured_queries if "orders_gatewayfault" in q["sql"]]
    assert ledger(order) == [("key-1", 1000)]


# the tools on the database -----------------------------------------------------------------


def test_the_order_tools_are_registered_on_the_database_gateway() -> None:
    refund_order = tool_registry.get("refund_order")
    get_order = tool_registry.get("get_order")

    assert refund_order is not None and refund_order.writes
    assert get_order is not None and not get_order.writes
    assert {"ORDER_NOT_FOUND", "CURRENCY_MISMATCH", "AMOUNT_EXCEEDS_REFUNDABLE"} <= {
        code.name for code in tool_registry.catalogue
    }


def test_the_refund_tool_refunds_through_the_ledger_with_the_callers_key(order: Order) -> None:
    spec = tool_registry.get("refund_order")
    assert spec is not None
    arguments = RefundOrderArguments(
        order_id="ORD-1001", amount_cents=2590, currency="BRL", reason="damaged"
    )
    context = ExecutionContext(
        customer_id="CUS-1", idempotency_key="call-key", approved_by=("ana",)
    )

    data = spec.handler(arguments, context)

    assert data["amount_cents"] == 2590 and data["refundable_cents"] == 12_000 - 2590
    assert Refund.objects.get().approved_by == "ana"
    assert ledger(order) == [("call-key", 2590)]

    with pytest.raises(Refused) as excinfo:
        spec.handler(
            arguments.model_copy(update={"amount_cents": 12_000}),
            ExecutionContext(customer_id="CUS-1", idempotency_key="other-key"),
        )

    assert excinfo.value.rejection.code.name == "AMOUNT_EXCEEDS_REFUNDABLE"
    assert ledger(order) == [("call-key", 2590)]

"""The gold writes of τ²-bench's retail tasks, each bent to break one rule of the desk's policy:
every variant is refused with the rule's code, and nothing is written.

Variants are made from the data on the fresh copy (another user's order, an order of the wrong
status, another product's item, a payment method not on file, a gift card short of what it would
pay, a second modification, a reason not in the list, ...). Figures are printed with -s and kept in
docs/retail.md.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
from django.db import transaction

from dispatch.registry import tool_registry
from retail.book import cents_of
from retail.models import PaymentMethod
from retail.selectors import retail_snapshot
from tests.retail.conftest import RetailCall
from tests.retail.reference import actions, run, tasks

pytestmark = pytest.mark.django_db

ITEM_TOOLS = ("modify_pending_order_items", "exchange_delivered_order_items")
PENDING_TOOLS = (
    "cancel_pending_order",
    "modify_pending_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
)
DELIVERED_TOOLS = ("return_delivered_order_items", "exchange_delivered_order_items")


# The kinds of variant the gold writes must give at least.
KINDS = {
    "another user's order",
    "an order of the wrong status",
    "another product's item",
    "a payment method not on file",
    "more than a gift card's balance",
    "a second modification",
    "a reason not in the list",
}


def _declared_codes(tool: str) -> set[str]:
    """The business codes the tool declares (its check's and its handler's)."""
    spec = tool_registry.get(tool)
    assert spec is not None
    return {code.name for code in spec.codes}


class Variant(NamedTuple):
    kind: str
    customer: str
    tool: str
    arguments: dict[str, Any]
    code: str
    # What the data must be before the call (a gift card's balance), or calls made first.
    prepare: Callable[[RetailCall], None] | None = None


def _gold_writes(base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each distinct gold write that the reference runs on the fresh data."""
    writes: dict[str, tuple[str, dict[str, Any]]] = {}
    for task in tasks():
        for action in actions(task):
            name, arguments = action["name"], action["arguments"]
            writes_data = name in (*PENDING_TOOLS, *DELIVERED_TOOLS, "modify_user_address")
            if writes_data and run(copy.deepcopy(base), name, arguments).ok:
                writes[json.dumps([name, arguments], sort_keys=True)] = (name, arguments)
    return list(writes.values())


class _Data:
    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.variants = {
            item_id: (product_id, variant)
            for product_id, product in base["products"].items()
            for item_id, variant in product["variants"].items()
        }

    def owner(self, tool: str, arguments: dict[str, Any]) -> str:
        if "order_id" in arguments:
            return str(self.base["orders"][arguments["order_id"]]["user_id"])
        return str(arguments["user_id"])

    def methods(self, user_id: str) -> dict[str, Any]:
        methods: dict[str, Any] = self.base["users"][user_id]["payment_methods"]
        return methods

    def other_user(self, user_id: str) -> str:
        return str(next(uid for uid in self.base["users"] if uid != user_id))

    def order_of_another(self, user_id: str, status: str) -> str | None:
        return next(
            (
                oid
                for oid, order in self.base["orders"].items()
                if order["user_id"] != user_id and order["status"] == status
            ),
            None,
        )

    def order_not(self, user_id: str, status: str) -> str | None:
        return next(
            (
                oid
                for oid in self.base["users"][user_id]["orders"]
                if self.base["orders"][oid]["status"] != status
            ),
            None,
        )

    def difference_cents(self, arguments: dict[str, Any]) -> int:
        items = self.base["orders"][arguments["order_id"]]["items"]
        total = 0
        for item_id, new_item_id in zip(
            arguments["item_ids"], arguments["new_item_ids"], strict=True
        ):
            price = next(item["price"] for item in items if item["item_id"] == item_id)
            total += cents_of(self.variants[new_item_id][1]["price"]) - cents_of(price)
        return total


def _short_gift_card(customer: str, card: str, amount_cents: int) -> Callable[[RetailCall], None]:
    def prepare(call: RetailCall) -> None:
        PaymentMethod.objects.filter(user__user_id=customer, payment_method_id=card).update(
            balance_cents=amount_cents - 1
        )

    return prepare


def _first(tool: str, arguments: dict[str, Any], customer: str) -> Callable[[RetailCall], None]:
    def prepare(call: RetailCall) -> None:
        answer = call(tool, arguments, customer=customer, session="first")
        assert answer["ok"], answer

    return prepare


def variants_of(data: _Data, tool: str, arguments: dict[str, Any]) -> Iterator[Variant]:
    customer = data.owner(tool, arguments)
    order = data.base["orders"].get(arguments.get("order_id", ""))

    def bent(kind: str, code: str, **changes: Any) -> Variant:
        return Variant(kind, customer, tool, {**arguments, **changes}, code)

    if order is not None:
        other = data.order_of_another(customer, order["status"])
        if other is not None:
            yield bent("another user's order", "ORDER_NOT_FOUND", order_id=other)
        wanted = "pending" if tool in PENDING_TOOLS else "delivered"
        wrong = data.order_not(customer, wanted)
        if wrong is not None:
            code = "ORDER_NOT_PENDING" if wanted == "pending" else "ORDER_NOT_DELIVERED"
            yield bent("an order of the wrong status", code, order_id=wrong)
    else:
        yield bent("another user's profile", "USER_NOT_FOUND", user_id=data.other_user(customer))

    if "payment_method_id" in arguments:
        foreign = next(iter(data.methods(data.other_user(customer))))
        if foreign not in data.methods(customer):
            yield bent(
                "a payment method not on file",
                "PAYMENT_METHOD_NOT_FOUND",
                payment_method_id=foreign,
            )

    if tool in ITEM_TOOLS or tool == "return_delivered_order_items":
        held = {item["item_id"] for item in order["items"]} if order else set()
        stranger = next(item_id for item_id in data.variants if item_id not in held)
        yield bent(
            "an item not in the order",
            "ITEM_NOT_IN_ORDER",
            item_ids=[stranger, *arguments["item_ids"][1:]],
        )

    if tool in ITEM_TOOLS:
        old = arguments["item_ids"][0]
        product_id = data.variants[old][0] if old in data.variants else None
        if product_id is None:
            product_id = next(i["product_id"] for i in order["items"] if i["item_id"] == old)
        elsewhere = next(
            item_id
            for item_id, (pid, variant) in data.variants.items()
            if pid != product_id and variant["available"]
        )
        rest = arguments["new_item_ids"][1:]
        yield bent("another product's item", "ITEM_NOT_OF_PRODUCT", new_item_ids=[elsewhere, *rest])
        unavailable = next(
            (
                item_id
                for item_id, (pid, variant) in data.variants.items()
                if pid == product_id and not variant["available"] and item_id != old
            ),
            None,
        )
        if unavailable is not None:
            yield bent("an unavailable item", "ITEM_UNAVAILABLE", new_item_ids=[unavailable, *rest])
        yield bent("the same item", "ITEM_UNCHANGED", new_item_ids=[old, *rest])
        yield bent(
            "one new item more than items",
            "ITEM_COUNT_MISMATCH",
            new_item_ids=[*arguments["new_item_ids"], arguments["new_item_ids"][0]],
        )
        difference = data.difference_cents(arguments)
        cards = [pid for pid, m in data.methods(customer).items() if m["source"] == "gift_card"]
        if difference > 0 and cards:
            yield Variant(
                "more than a gift card's balance",
                customer,
                tool,
                {**arguments, "payment_method_id": cards[0]},
                "GIFT_CARD_INSUFFICIENT_BALANCE",
                _short_gift_card(customer, cards[0], difference),
            )

    passing = arguments
    if tool in ITEM_TOOLS and order is not None and data.difference_cents(arguments) < 0:
        # A price difference back to the customer goes to a method that paid the order.
        paid_by = order["payment_history"][0]["payment_method_id"]
        passing = {**arguments, "payment_method_id": paid_by}
        elsewhere_method = next((pid for pid in data.methods(customer) if pid != paid_by), None)
        if elsewhere_method is not None:
            yield bent(
                "a price difference refunded to a method that did not pay",
                "REFUND_EXCEEDS_PAYMENT",
                payment_method_id=elsewhere_method,
            )

    if tool == "modify_pending_order_items":
        again = _first(tool, passing, customer)
        yield Variant(
            "a second modification", customer, tool, arguments, "ORDER_ALREADY_MODIFIED", again
        )
        yield Variant(
            "a cancellation after a modification",
            customer,
            "cancel_pending_order",
            {"order_id": arguments["order_id"], "reason": "no longer needed"},
            "ORDER_ALREADY_MODIFIED",
            again,
        )

    if tool == "cancel_pending_order":
        yield bent("a reason not in the list", "INVALID_ARGUMENTS", reason="changed my mind")

    if tool == "return_delivered_order_items" and order is not None:
        original = order["payment_history"][0]["payment_method_id"]
        elsewhere_method = next(
            (
                pid
                for pid, m in data.methods(customer).items()
                if m["source"] != "gift_card" and pid != original
            ),
            None,
        )
        if elsewhere_method is not None:
            yield bent(
                "a refund to a method other than the original",
                "REFUND_METHOD_NOT_ALLOWED",
                payment_method_id=elsewhere_method,
            )

    if tool == "modify_pending_order_payment" and order is not None:
        paid = order["payment_history"][0]
        yield bent(
            "the method that paid",
            "PAYMENT_METHOD_UNCHANGED",
            payment_method_id=paid["payment_method_id"],
        )
        cards = [
            pid
            for pid, m in data.methods(customer).items()
            if m["source"] == "gift_card" and pid != paid["payment_method_id"]
        ]
        if cards:
            amount = cents_of(paid["amount"])
            yield Variant(
                "more than a gift card's balance",
                customer,
                tool,
                {**arguments, "payment_method_id": cards[0]},
                "GIFT_CARD_INSUFFICIENT_BALANCE",
                _short_gift_card(customer, cards[0], amount),
            )


def print_kinds(made: Counter[str], refused: Counter[str], wrong: list[str]) -> None:
    """How many variants of each kind were made and refused, and those that were not."""
    for kind, count in sorted(made.items()):
        print(f"  {kind}: {count} made, {refused[kind]} refused")
    for line in wrong:
        print("  NOT REFUSED AS EXPECTED", line)


class _RolledBack(Exception):
    pass


def test_every_policy_violating_variant_of_a_gold_write_is_refused_and_writes_nothing(
    retail_db: dict[str, Any], retail_call: RetailCall
) -> None:
    data = _Data(retail_db)
    fresh = retail_snapshot()
    made: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    wrong: list[str] = []

    for at, (tool, arguments) in enumerate(_gold_writes(retail_db)):
        for number, variant in enumerate(variants_of(data, tool, arguments)):
            made[variant.kind] += 1
            try:
                with transaction.atomic():
                    before = fresh
                    if variant.prepare is not None:
                        variant.prepare(retail_call)
                        before = retail_snapshot()
                    answer = retail_call(
                        variant.tool,
                        variant.arguments,
                        customer=variant.customer,
                        session=f"variant-{at}-{number}",
                    )
                    written = retail_snapshot() != before
                    declared = _declared_codes(variant.tool) | {"INVALID_ARGUMENTS"}
                    if answer["ok"] or answer["code"] != variant.code or written:
                        wrong.append(
                            f"{variant.kind}: {variant.tool} {variant.arguments} answered "
                            f"{answer['code']} ({answer['message']}), wrote: {written}"
                        )
                    else:
                        assert variant.code in declared, variant
                        refused[variant.kind] += 1
                    raise _RolledBack
            except _RolledBack:
                pass

    print(
        f"\nPolicy-violating variants of the gold writes: {sum(made.values())} made, "
        f"{sum(refused.values())} refused with their code and nothing written"
    )
    print_kinds(made, refused, wrong)

    assert wrong == []
    assert refused == made
    assert set(made) >= KINDS

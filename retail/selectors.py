"""The retail tables read back in the shape of τ²-bench's db.json, amounts in its dollars."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import QuerySet

from retail.book import dollars
from retail.models import (
    OrderItem,
    Payment,
    PaymentMethod,
    Product,
    RetailOrder,
    RetailUser,
    Variant,
)

_ADDRESS = ("address1", "address2", "city", "country", "state", "zip")
# The order's keys the data has only once an action set them.
_OPTIONAL = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "return_items",
    "return_payment_method_id",
)


def _rows(rows: QuerySet[Any]) -> list[dict[str, Any]]:
    return list(rows.values())


def retail_snapshot() -> dict[str, Any]:
    """Every product, user and order, as db.json holds them."""
    variants: dict[int, dict[str, Any]] = defaultdict(dict)
    for v in Variant.objects.order_by("product_id", "position").values():
        variants[v["product_id"]][v["item_id"]] = {
            "item_id": v["item_id"],
            "options": v["options"],
            "available": v["available"],
            "price": dollars(v["price_cents"]),
        }
    products = {
        p["product_id"]: {
            "name": p["name"],
            "product_id": p["product_id"],
            "variants": variants[p["id"]],
        }
        for p in Product.objects.order_by("position").values()
    }
    methods: dict[int, dict[str, Any]] = defaultdict(dict)
    for m in PaymentMethod.objects.order_by("user_id", "position").values():
        method: dict[str, Any] = {"source": m["source"], "id": m["payment_method_id"]}
        if m["source"] == "credit_card":
            method.update(brand=m["brand"], last_four=m["last_four"])
        if m["balance_cents"] is not None:
            method["balance"] = dollars(m["balance_cents"])
        methods[m["user_id"]][m["payment_method_id"]] = method
    order_ids: dict[int, list[str]] = defaultdict(list)
    placed = RetailOrder.objects.order_by("user_id", "user_position")
    for user_pk, order_id in placed.values_list("user_id", "order_id"):
        order_ids[user_pk].append(order_id)
    users = {
        u["user_id"]: {
            "user_id": u["user_id"],
            "name": {"first_name": u["first_name"], "last_name": u["last_name"]},
            "address": {name: u[name] for name in _ADDRESS},
            "email": u["email"],
            "payment_methods": methods[u["id"]],
            "orders": order_ids[u["id"]],
        }
        for u in _rows(RetailUser.objects.order_by("id"))
    }
    user_ids = dict(RetailUser.objects.values_list("id", "user_id"))
    items: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for i in OrderItem.objects.order_by("order_id", "position").values():
        items[i["order_id"]].append(
            {
                "name": i["name"],
                "product_id": i["product_id"],
                "item_id": i["item_id"],
                "price": dollars(i["price_cents"]),
                "options": i["options"],
            }
        )
    payments: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for p in Payment.objects.order_by("order_id", "position").values():
        payments[p["order_id"]].append(
            {
                "transaction_type": p["transaction_type"],
                "amount": dollars(p["amount_cents"]),
                "payment_method_id": p["payment_method_id"],
            }
        )
    orders = {}
    for o in _rows(RetailOrder.objects.order_by("id")):
        order: dict[str, Any] = {
            "order_id": o["order_id"],
            "user_id": user_ids[o["user_id"]],
            "address": {name: o[name] for name in _ADDRESS},
            "items": items[o["id"]],
            "status": o["status"],
            "fulfillments": o["fulfillments"],
            "payment_history": payments[o["id"]],
        }
        order.update({name: o[name] for name in _OPTIONAL if o[name] not in (None, "")})
        difference = o["exchange_price_difference_cents"]
        if difference is not None:
            order["exchange_price_difference"] = dollars(difference)
        orders[o["order_id"]] = order
    return {"products": products, "users": users, "orders": orders}

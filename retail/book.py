"""The retail desk's rules, on plain values: what each write would change, or why it may not.

Every write is judged here once: its check (is there a plan or a refusal?), the money the gate
counts (the plan's), and its effect (the plan, applied by `retail.gateway` under a lock after
judging again on the locked rows). The rules are docs/retail.md's, from the desk's policy; each
refusal carries a stable code and says what would pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dispatch.pipeline.codes import Code
from dispatch.pipeline.tools import Rejection

CURRENCY = "USD"
CANCEL_REASONS = ("no longer needed", "ordered by mistake")

PENDING = "pending"
PENDING_ITEM_MODIFIED = "pending (item modified)"
DELIVERED = "delivered"
CANCELLED = "cancelled"
RETURN_REQUESTED = "return requested"
EXCHANGE_REQUESTED = "exchange requested"
GIFT_CARD = "gift_card"


def _code(name: str, meaning: str, model_fixable: bool = True) -> Code:
    return Code(name, 5, meaning, model_fixable, False)


# Declared as the order tools declare it, field for field: one code for a missing order whatever
# the domain (the registry refuses one name declared twice differently).
ORDER_NOT_FOUND = _code(
    "ORDER_NOT_FOUND",
    "No order with that id exists for this customer; ids must come from the user, not be guessed.",
)
USER_NOT_FOUND = _code(
    "USER_NOT_FOUND",
    "No user matches for this conversation: only the authenticated customer can be found.",
)
PRODUCT_NOT_FOUND = _code("PRODUCT_NOT_FOUND", "No product with that product id exists.")
ITEM_NOT_FOUND = _code("ITEM_NOT_FOUND", "No item (variant) with that item id exists.")
ORDER_NOT_PENDING = _code(
    "ORDER_NOT_PENDING",
    "Only a pending order can be cancelled or modified; this one is not pending.",
    False,
)
ORDER_ALREADY_MODIFIED = _code(
    "ORDER_ALREADY_MODIFIED",
    "The order's items were already modified once: it can no longer be modified or cancelled.",
    False,
)
ORDER_NOT_DELIVERED = _code(
    "ORDER_NOT_DELIVERED",
    "Only a delivered order's items can be returned or exchanged; this one is not delivered.",
    False,
)
ITEM_NOT_IN_ORDER = _code(
    "ITEM_NOT_IN_ORDER", "An item id is not in the order (or not as many times as listed)."
)
ITEM_COUNT_MISMATCH = _code(
    "ITEM_COUNT_MISMATCH", "item_ids and new_item_ids must list as many items, pair by pair."
)
ITEM_UNCHANGED = _code(
    "ITEM_UNCHANGED", "A new item must be another option of the product, not the same item."
)
ITEM_NOT_OF_PRODUCT = _code(
    "ITEM_NOT_OF_PRODUCT",
    "A new item must be a variant of the same product as the item it replaces.",
)
ITEM_UNAVAILABLE = _code("ITEM_UNAVAILABLE", "The new item is not available.")
PAYMENT_METHOD_NOT_FOUND = _code(
    "PAYMENT_METHOD_NOT_FOUND", "The payment method is not in the customer's profile."
)
PAYMENT_METHOD_UNCHANGED = _code(
    "PAYMENT_METHOD_UNCHANGED", "The new payment method must differ from the one that paid."
)
PAYMENT_NOT_CHANGEABLE = _code(
    "PAYMENT_NOT_CHANGEABLE",
    "The order's payment cannot be changed: its history is not exactly one payment.",
    False,
)
REFUND_EXCEEDS_PAYMENT = _code(
    "REFUND_EXCEEDS_PAYMENT",
    "Money goes back only to a method that paid the order, at most what it paid net of what it "
    "already got back.",
)
REFUND_METHOD_NOT_ALLOWED = _code(
    "REFUND_METHOD_NOT_ALLOWED",
    "A return is refunded to the original payment method or to a gift card in the profile.",
)
GIFT_CARD_INSUFFICIENT_BALANCE = _code(
    "GIFT_CARD_INSUFFICIENT_BALANCE",
    "The gift card's balance does not cover what it would pay.",
)
INVALID_EXPRESSION = _code(
    "INVALID_EXPRESSION",
    "The expression is not arithmetic on numbers with + - * / and parentheses, or divides by 0.",
)

RETAIL_CODES = (
    ORDER_NOT_FOUND,
    USER_NOT_FOUND,
    PRODUCT_NOT_FOUND,
    ITEM_NOT_FOUND,
    ORDER_NOT_PENDING,
    ORDER_ALREADY_MODIFIED,
    ORDER_NOT_DELIVERED,
    ITEM_NOT_IN_ORDER,
    ITEM_COUNT_MISMATCH,
    ITEM_UNCHANGED,
    ITEM_NOT_OF_PRODUCT,
    ITEM_UNAVAILABLE,
    PAYMENT_METHOD_NOT_FOUND,
    PAYMENT_METHOD_UNCHANGED,
    PAYMENT_NOT_CHANGEABLE,
    REFUND_METHOD_NOT_ALLOWED,
    REFUND_EXCEEDS_PAYMENT,
    GIFT_CARD_INSUFFICIENT_BALANCE,
    INVALID_EXPRESSION,
)


class Address(NamedTuple):
    address1: str
    address2: str
    city: str
    state: str
    country: str
    zip: str


class PaymentMethodView(NamedTuple):
    payment_method_id: str
    source: str
    brand: str = ""
    last_four: str = ""
    # A gift card's balance in cents; None for the others.
    balance_cents: int | None = None

    @property
    def gift_card(self) -> bool:
        return self.source == GIFT_CARD


class UserView(NamedTuple):
    user_id: str
    first_name: str
    last_name: str
    email: str
    address: Address
    payment_methods: tuple[PaymentMethodView, ...]
    order_ids: tuple[str, ...]

    def method(self, payment_method_id: str) -> PaymentMethodView | None:
        return next(
            (m for m in self.payment_methods if m.payment_method_id == payment_method_id), None
        )


class ItemLine(NamedTuple):
    name: str
    product_id: str
    item_id: str
    price_cents: int
    options: Mapping[str, Any]


class PaymentLine(NamedTuple):
    transaction_type: str
    amount_cents: int
    payment_method_id: str


class OrderView(NamedTuple):
    order_id: str
    user_id: str
    address: Address
    items: tuple[ItemLine, ...]
    status: str
    fulfillments: Sequence[Mapping[str, Any]]
    payments: tuple[PaymentLine, ...]
    cancel_reason: str | None = None
    exchange_items: Sequence[str] | None = None
    exchange_new_items: Sequence[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference_cents: int | None = None
    return_items: Sequence[str] | None = None
    return_payment_method_id: str | None = None

    def first(self, item_id: str) -> ItemLine | None:
        return next((item for item in self.items if item.item_id == item_id), None)

    @property
    def paid_cents(self) -> int:
        """What the order was paid, net of what it already gave back: after a payment change,
        the order's total once, not the two payments."""
        return sum(cents for cents in self.net_paid().values() if cents > 0)

    def net_paid(self) -> dict[str, int]:
        """What each method paid the order net of what it got back, in the order the methods
        first appear in the payment history: what may still go back to each."""
        net: dict[str, int] = {}
        for line in self.payments:
            sign = 1 if line.transaction_type == "payment" else -1
            net[line.payment_method_id] = (
                net.get(line.payment_method_id, 0) + sign * line.amount_cents
            )
        return net


class VariantView(NamedTuple):
    item_id: str
    product_id: str
    options: Mapping[str, Any]
    available: bool
    price_cents: int


class ProductView(NamedTuple):
    product_id: str
    name: str
    variants: tuple[VariantView, ...]


class Plan(NamedTuple):
    """What a write changes, all at once: the gateway applies it to the locked rows."""

    subject: str
    # The money the gate counts for it (cents, USD): what leaves or changes hands.
    money_cents: int | None = None
    status: str | None = None
    # Other columns of the order (an address, a reason, what a return or an exchange names).
    order_fields: Mapping[str, Any] = {}
    # Lines appended to the order's payment history, in order.
    payments: tuple[PaymentLine, ...] = ()
    # Gift card balance changes, by payment method id, in cents.
    balances: tuple[tuple[str, int], ...] = ()
    # Items replaced, by their place in the order.
    items: tuple[tuple[int, ItemLine], ...] = ()
    # The user's new default address.
    user_address: Address | None = None


def dollars(cents: int) -> float:
    """Cents as the data's dollars: 4784 is 47.84, the same float the data's text parses to."""
    return cents / 100


def cents_of(dollars_value: float | int) -> int:
    """The data's dollars as cents: exact for every amount with at most two decimals."""
    return round(dollars_value * 100)


# What the tools answer: the benchmark's own shapes, amounts in its dollars.


def address_as_data(address: Address) -> dict[str, str]:
    return address._asdict()


def method_as_data(method: PaymentMethodView) -> dict[str, Any]:
    data: dict[str, Any] = {"source": method.source, "id": method.payment_method_id}
    if method.source == "credit_card":
        data.update(brand=method.brand, last_four=method.last_four)
    if method.balance_cents is not None:
        data["balance"] = dollars(method.balance_cents)
    return data


def user_as_data(user: UserView) -> dict[str, Any]:
    return {
        "user_id": user.user_id,
        "name": {"first_name": user.first_name, "last_name": user.last_name},
        "address": address_as_data(user.address),
        "email": user.email,
        "payment_methods": {m.payment_method_id: method_as_data(m) for m in user.payment_methods},
        "orders": list(user.order_ids),
    }


def item_as_data(item: ItemLine) -> dict[str, Any]:
    return {
        "name": item.name,
        "product_id": item.product_id,
        "item_id": item.item_id,
        "price": dollars(item.price_cents),
        "options": dict(item.options),
    }


def _listed(values: Sequence[str] | None) -> list[str] | None:
    return None if values is None else list(values)


def order_as_data(order: OrderView) -> dict[str, Any]:
    difference = order.exchange_price_difference_cents
    return {
        "order_id": order.order_id,
        "user_id": order.user_id,
        "address": address_as_data(order.address),
        "items": [item_as_data(item) for item in order.items],
        "status": order.status,
        "fulfillments": [dict(f) for f in order.fulfillments],
        "payment_history": [
            {
                "transaction_type": p.transaction_type,
                "amount": dollars(p.amount_cents),
                "payment_method_id": p.payment_method_id,
            }
            for p in order.payments
        ],
        "cancel_reason": order.cancel_reason,
        "exchange_items": _listed(order.exchange_items),
        "exchange_new_items": _listed(order.exchange_new_items),
        "exchange_payment_method_id": order.exchange_payment_method_id,
        "exchange_price_difference": None if difference is None else dollars(difference),
        "return_items": _listed(order.return_items),
        "return_payment_method_id": order.return_payment_method_id,
    }


def variant_as_data(variant: VariantView) -> dict[str, Any]:
    return {
        "item_id": variant.item_id,
        "options": dict(variant.options),
        "available": variant.available,
        "price": dollars(variant.price_cents),
    }


def product_as_data(product: ProductView) -> dict[str, Any]:
    return {
        "name": product.name,
        "product_id": product.product_id,
        "variants": {v.item_id: variant_as_data(v) for v in product.variants},
    }


# The refusals, worded with their fix.


def order_not_found(order_id: str) -> Rejection:
    return Rejection(
        ORDER_NOT_FOUND,
        f"order_id: no order {order_id} exists for this customer (use an id from the user's "
        "details or the user; ask them to check it)",
    )


def user_not_found(what: str) -> Rejection:
    return Rejection(
        USER_NOT_FOUND,
        f"{what}: no user matches (check the spelling with the user; you can only help the user "
        "this conversation is for)",
    )


def method_not_found(payment_method_id: str, user: UserView) -> Rejection:
    on_file = ", ".join(m.payment_method_id for m in user.payment_methods) or "none"
    return Rejection(
        PAYMENT_METHOD_NOT_FOUND,
        f"payment_method_id: {payment_method_id} is not in the user's profile (on file: {on_file})",
        {"payment_methods": [m.payment_method_id for m in user.payment_methods]},
    )


def _status_refusal(order: OrderView, wanted: str, action: str) -> Rejection | None:
    if order.status == wanted:
        return None
    if wanted == PENDING and order.status == PENDING_ITEM_MODIFIED:
        return Rejection(
            ORDER_ALREADY_MODIFIED,
            f"order_id: order {order.order_id}'s items were already modified; it cannot be "
            f"{action} any more (tell the user; a human agent can help further)",
            {"status": order.status},
        )
    code = ORDER_NOT_PENDING if wanted == PENDING else ORDER_NOT_DELIVERED
    return Rejection(
        code,
        f"order_id: order {order.order_id} is {order.status}, not {wanted}; only a {wanted} "
        f"order can be {action} (check its status with get_order_details)",
        {"status": order.status},
    )


def _items_refusal(order: OrderView, item_ids: Sequence[str]) -> Rejection | None:
    held = Counter(item.item_id for item in order.items)
    for item_id, count in Counter(item_ids).items():
        if count > held[item_id]:
            return Rejection(
                ITEM_NOT_IN_ORDER,
                f"item_ids: order {order.order_id} holds {item_id} {held[item_id]} time(s), not "
                f"{count} (use the item ids of get_order_details)",
                {"item_id": item_id},
            )
    return None


def _gift_card_refusal(method: PaymentMethodView, amount_cents: int) -> Rejection | None:
    balance = method.balance_cents
    if not method.gift_card or balance is None or balance >= amount_cents:
        return None
    return Rejection(
        GIFT_CARD_INSUFFICIENT_BALANCE,
        f"payment_method_id: gift card {method.payment_method_id} has {dollars(balance):.2f} "
        f"USD, less than the {dollars(amount_cents):.2f} USD it would pay (choose another method)",
        {"balance_cents": balance, "amount_cents": amount_cents},
    )


def _refund_refusal(
    order: OrderView, payment_method_id: str, amount_cents: int
) -> Rejection | None:
    """Money goes back only where it came from: a method gets at most what it paid the order,
    net of what it already got back, so no sequence of operations pays a method twice."""
    net = order.net_paid()
    if amount_cents <= 0 or net.get(payment_method_id, 0) >= amount_cents:
        return None
    enough = [pid for pid, cents in net.items() if cents >= amount_cents]
    instead = f"refund to {' or '.join(enough)}" if enough else "a human agent can help"
    return Rejection(
        REFUND_EXCEEDS_PAYMENT,
        f"payment_method_id: {payment_method_id} paid order {order.order_id} "
        f"{dollars(max(net.get(payment_method_id, 0), 0)):.2f} USD net of refunds, less than the "
        f"{dollars(amount_cents):.2f} USD it would get back ({instead})",
        {
            "refundable_cents": {pid: cents for pid, cents in net.items() if cents > 0},
            "amount_cents": amount_cents,
        },
    )


def _order_refund_refusal(order: OrderView, amount_cents: int) -> Rejection | None:
    """Store credit on a gift card (a return, as the policy allows) is at most what the order
    was paid, net of what it already gave back."""
    refundable = sum(cents for cents in order.net_paid().values() if cents > 0)
    if amount_cents <= refundable:
        return None
    return Rejection(
        REFUND_EXCEEDS_PAYMENT,
        f"item_ids: order {order.order_id} has {dollars(refundable):.2f} USD left to refund, "
        f"less than the {dollars(amount_cents):.2f} USD these items would get back (a human "
        "agent can help)",
        {"refundable_cents": refundable, "amount_cents": amount_cents},
    )


class _Changes(NamedTuple):
    """Items replaced pair by pair, with the price difference (positive: the customer pays)."""

    items: tuple[tuple[int, ItemLine], ...]
    difference_cents: int


def _changes(
    order: OrderView,
    item_ids: Sequence[str],
    new_item_ids: Sequence[str],
    variants: Mapping[str, VariantView],
) -> _Changes | Rejection:
    refusal = _items_refusal(order, item_ids)
    if refusal is not None:
        return refusal
    if len(item_ids) != len(new_item_ids):
        return Rejection(
            ITEM_COUNT_MISMATCH,
            f"new_item_ids: {len(new_item_ids)} new items for {len(item_ids)} items (give one "
            "new item per item, in the same order)",
        )
    lines = list(order.items)
    replaced: list[tuple[int, ItemLine]] = []
    difference = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        # The first item of that id not replaced yet: a listed twice item is replaced twice.
        at = next(i for i, line in enumerate(lines) if line.item_id == item_id)
        item = lines[at]
        if new_item_id == item_id:
            return Rejection(
                ITEM_UNCHANGED,
                f"new_item_ids: {new_item_id} is the item itself; choose another option of "
                f"{item.name}",
            )
        variant = variants.get(new_item_id)
        if variant is None or variant.product_id != item.product_id:
            return Rejection(
                ITEM_NOT_OF_PRODUCT,
                f"new_item_ids: {new_item_id} is not a variant of {item.name} (product "
                f"{item.product_id}); choose one of get_product_details {item.product_id}",
                {"item_id": item_id, "product_id": item.product_id},
            )
        if not variant.available:
            return Rejection(
                ITEM_UNAVAILABLE,
                f"new_item_ids: {new_item_id} ({item.name}) is not available; choose an "
                "available option",
                {"item_id": new_item_id},
            )
        difference += variant.price_cents - item.price_cents
        line = item._replace(
            item_id=new_item_id, price_cents=variant.price_cents, options=variant.options
        )
        lines[at] = line
        replaced.append((at, line))
    return _Changes(tuple(replaced), difference)


def _balances(user: UserView, *changes: tuple[str, int]) -> tuple[tuple[str, int], ...]:
    """The changes that fall on gift cards: the other methods keep no balance here."""
    cards = {m.payment_method_id for m in user.payment_methods if m.gift_card}
    return tuple((pid, delta) for pid, delta in changes if pid in cards and delta)


def plan_cancel(order: OrderView, user: UserView, reason: str) -> Plan | Rejection:
    refusal = _status_refusal(order, PENDING, "cancelled")
    if refusal is not None:
        return refusal
    # What each method paid, net of what it already got back (a payment change refunded the
    # first method), goes back where it came from: at once to a gift card, in days otherwise.
    refunds = tuple(
        PaymentLine("refund", cents, pid) for pid, cents in order.net_paid().items() if cents > 0
    )
    for refund in refunds:
        if user.method(refund.payment_method_id) is None:
            return method_not_found(refund.payment_method_id, user)
    return Plan(
        order.order_id,
        money_cents=sum(r.amount_cents for r in refunds),
        status=CANCELLED,
        order_fields={"cancel_reason": reason},
        payments=refunds,
        balances=_balances(user, *((r.payment_method_id, r.amount_cents) for r in refunds)),
    )


def _paid_changes(
    order: OrderView,
    user: UserView,
    item_ids: Sequence[str],
    new_item_ids: Sequence[str],
    payment_method_id: str,
    variants: Mapping[str, VariantView],
    status: str,
    verb: str,
) -> _Changes | Rejection:
    """What modifying (a pending order) and exchanging (a delivered one) both check, in the
    same order: the order's status, the items and their new variants, the paying method on file
    and a gift card's balance for the difference."""
    refusal = _status_refusal(order, status, verb)
    if refusal is not None:
        return refusal
    changes = _changes(order, item_ids, new_item_ids, variants)
    if isinstance(changes, Rejection):
        return changes
    method = user.method(payment_method_id)
    if method is None:
        return method_not_found(payment_method_id, user)
    refusal = _gift_card_refusal(method, changes.difference_cents) or _refund_refusal(
        order, payment_method_id, -changes.difference_cents
    )
    if refusal is not None:
        return refusal
    return changes


def plan_modify_items(
    order: OrderView,
    user: UserView,
    item_ids: Sequence[str],
    new_item_ids: Sequence[str],
    payment_method_id: str,
    variants: Mapping[str, VariantView],
) -> Plan | Rejection:
    changes = _paid_changes(
        order, user, item_ids, new_item_ids, payment_method_id, variants, PENDING, "modified"
    )
    if isinstance(changes, Rejection):
        return changes
    difference = changes.difference_cents
    kind = "payment" if difference > 0 else "refund"
    return Plan(
        order.order_id,
        money_cents=abs(difference),
        status=PENDING_ITEM_MODIFIED,
        payments=(PaymentLine(kind, abs(difference), payment_method_id),),
        balances=_balances(user, (payment_method_id, -difference)),
        items=changes.items,
    )


def plan_modify_address(order: OrderView, address: Address) -> Plan | Rejection:
    refusal = _status_refusal(order, PENDING, "modified")
    if refusal is not None:
        return refusal
    return Plan(order.order_id, order_fields=address._asdict())


def plan_modify_payment(
    order: OrderView, user: UserView, payment_method_id: str
) -> Plan | Rejection:
    refusal = _status_refusal(order, PENDING, "modified")
    if refusal is not None:
        return refusal
    method = user.method(payment_method_id)
    if method is None:
        return method_not_found(payment_method_id, user)
    if len(order.payments) != 1 or order.payments[0].transaction_type != "payment":
        return Rejection(
            PAYMENT_NOT_CHANGEABLE,
            f"order_id: order {order.order_id}'s payment history is not one payment; its "
            "payment method cannot be changed (a human agent can help)",
        )
    paid = order.payments[0]
    if paid.payment_method_id == payment_method_id:
        return Rejection(
            PAYMENT_METHOD_UNCHANGED,
            f"payment_method_id: order {order.order_id} is already paid with "
            f"{payment_method_id}; choose another method in the profile",
        )
    refusal = _gift_card_refusal(method, paid.amount_cents)
    if refusal is not None:
        return refusal
    return Plan(
        order.order_id,
        money_cents=paid.amount_cents,
        payments=(
            PaymentLine("payment", paid.amount_cents, payment_method_id),
            PaymentLine("refund", paid.amount_cents, paid.payment_method_id),
        ),
        balances=_balances(
            user,
            (payment_method_id, -paid.amount_cents),
            (paid.payment_method_id, paid.amount_cents),
        ),
    )


def plan_return(
    order: OrderView, user: UserView, item_ids: Sequence[str], payment_method_id: str
) -> Plan | Rejection:
    refusal = _status_refusal(order, DELIVERED, "returned")
    if refusal is not None:
        return refusal
    method = user.method(payment_method_id)
    if method is None:
        return method_not_found(payment_method_id, user)
    original = order.payments[0].payment_method_id if order.payments else ""
    if not method.gift_card and payment_method_id != original:
        return Rejection(
            REFUND_METHOD_NOT_ALLOWED,
            f"payment_method_id: a return is refunded to the original payment method "
            f"({original}) or to a gift card in the profile, not to {payment_method_id}",
            {"original_payment_method_id": original},
        )
    refusal = _items_refusal(order, item_ids)
    if refusal is not None:
        return refusal
    # What the return will refund: the items' prices, as the order lists them, never more than
    # the order was paid; to a gift card as the policy allows, else to the method that paid it.
    refund = sum(line.price_cents for line in map(order.first, item_ids) if line is not None)
    if method.gift_card:
        refusal = _order_refund_refusal(order, refund)
    else:
        refusal = _refund_refusal(order, payment_method_id, refund)
    if refusal is not None:
        return refusal
    return Plan(
        order.order_id,
        money_cents=refund,
        status=RETURN_REQUESTED,
        order_fields={
            "return_items": sorted(item_ids),
            "return_payment_method_id": payment_method_id,
        },
    )


def plan_exchange(
    order: OrderView,
    user: UserView,
    item_ids: Sequence[str],
    new_item_ids: Sequence[str],
    payment_method_id: str,
    variants: Mapping[str, VariantView],
) -> Plan | Rejection:
    changes = _paid_changes(
        order, user, item_ids, new_item_ids, payment_method_id, variants, DELIVERED, "exchanged"
    )
    if isinstance(changes, Rejection):
        return changes
    difference = changes.difference_cents
    # The items stay as delivered until they come back: the order records what was asked.
    return Plan(
        order.order_id,
        money_cents=abs(difference),
        status=EXCHANGE_REQUESTED,
        order_fields={
            "exchange_items": sorted(item_ids),
            "exchange_new_items": sorted(new_item_ids),
            "exchange_payment_method_id": payment_method_id,
            "exchange_price_difference_cents": difference,
        },
    )


def plan_user_address(user: UserView, address: Address) -> Plan:
    return Plan(user.user_id, user_address=address)


def applied(order: OrderView, plan: Plan) -> OrderView:
    """The order as the plan leaves it (what the gateway writes, as a value)."""
    items = list(order.items)
    for at, line in plan.items:
        items[at] = line
    fields = dict(plan.order_fields)
    address = Address(**{k: fields.pop(k, v) for k, v in order.address._asdict().items()})
    return order._replace(
        address=address,
        items=tuple(items),
        status=plan.status or order.status,
        payments=order.payments + plan.payments,
        **fields,
    )

"""The retail desk on the database: reads as plain values, and writes that apply a plan once per
idempotency key, judged again on the rows they lock."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import F

from dispatch.pipeline.tools import Refused, Rejection
from retail.book import (
    Address,
    ItemLine,
    OrderView,
    PaymentLine,
    PaymentMethodView,
    Plan,
    ProductView,
    UserView,
    VariantView,
    order_not_found,
    user_not_found,
)
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

_ADDRESS = ("address1", "address2", "city", "state", "country", "zip")


def _address(row: Any) -> Address:
    return Address(*(getattr(row, name) for name in _ADDRESS))


def _user_view(user: RetailUser) -> UserView:
    methods = tuple(
        PaymentMethodView(m.payment_method_id, m.source, m.brand, m.last_four, m.balance_cents)
        for m in PaymentMethod.objects.filter(user=user).order_by("position")
    )
    order_ids = tuple(
        RetailOrder.objects.filter(user=user)
        .order_by("user_position")
        .values_list("order_id", flat=True)
    )
    return UserView(
        user.user_id,
        user.first_name,
        user.last_name,
        user.email,
        _address(user),
        methods,
        order_ids,
    )


def _order_view(order: RetailOrder, user_id: str) -> OrderView:
    items = tuple(
        ItemLine(i.name, i.product_id, i.item_id, i.price_cents, i.options)
        for i in OrderItem.objects.filter(order=order).order_by("position")
    )
    payments = tuple(
        PaymentLine(p.transaction_type, p.amount_cents, p.payment_method_id)
        for p in Payment.objects.filter(order=order).order_by("position")
    )
    return OrderView(
        order_id=order.order_id,
        user_id=user_id,
        address=_address(order),
        items=items,
        status=order.status,
        fulfillments=order.fulfillments,
        payments=payments,
        cancel_reason=order.cancel_reason or None,
        exchange_items=order.exchange_items,
        exchange_new_items=order.exchange_new_items,
        exchange_payment_method_id=order.exchange_payment_method_id or None,
        exchange_price_difference_cents=order.exchange_price_difference_cents,
        return_items=order.return_items,
        return_payment_method_id=order.return_payment_method_id or None,
    )


def _variant_view(variant: Variant, product_id: str) -> VariantView:
    return VariantView(
        variant.item_id, product_id, variant.options, variant.available, variant.price_cents
    )


class OrmRetailBook:
    """What the retail tools read and write. Every read is scoped by the conversation's customer
    where the data is theirs: another user's order or profile is answered as one that does not
    exist."""

    def user(self, customer_id: str) -> UserView | None:
        user = RetailUser.objects.filter(user_id=customer_id).first()
        return None if user is None else _user_view(user)

    def order(self, customer_id: str, order_id: str) -> OrderView | None:
        order = RetailOrder.objects.filter(order_id=order_id, user__user_id=customer_id).first()
        return None if order is None else _order_view(order, customer_id)

    def product(self, product_id: str) -> ProductView | None:
        product = Product.objects.filter(product_id=product_id).first()
        if product is None:
            return None
        variants = tuple(
            _variant_view(v, product_id)
            for v in Variant.objects.filter(product=product).order_by("position")
        )
        return ProductView(product.product_id, product.name, variants)

    def variants(self, item_ids: Iterable[str]) -> dict[str, VariantView]:
        rows = Variant.objects.filter(item_id__in=set(item_ids)).select_related("product")
        return {v.item_id: _variant_view(v, v.product.product_id) for v in rows}

    def product_types(self) -> dict[str, str]:
        return dict(Product.objects.order_by("position").values_list("name", "product_id"))

    def outcome(self, key: str) -> Mapping[str, Any] | None:
        operation = Operation.objects.filter(idempotency_key=key).first()
        return None if operation is None else operation.result

    @transaction.atomic
    def write(
        self,
        *,
        tool: str,
        key: str,
        customer_id: str,
        order_id: str | None,
        judge: Callable[[OrderView | None, UserView], Plan | Rejection],
        answer: Callable[[OrderView | None, UserView], Mapping[str, Any]],
    ) -> Mapping[str, Any]:
        """Apply what `judge` plans on the rows as they are once locked, once per key: a
        repeated key answers what the first did and changes nothing."""
        # The user's row is the lock: every write of one customer queues here, so a gift card's
        # balance and an order's status are judged on what the writes before left them.
        user_row = RetailUser.objects.select_for_update().filter(user_id=customer_id).first()
        first = self.outcome(key)
        if first is not None:
            return first
        user = None if user_row is None else _user_view(user_row)
        order_row = (
            None
            if order_id is None or user_row is None
            else RetailOrder.objects.filter(order_id=order_id, user=user_row).first()
        )
        if user is None or (order_id is not None and order_row is None):
            raise Refused(
                order_not_found(order_id) if order_id is not None else user_not_found("user_id")
            )
        assert user_row is not None
        order = None if order_row is None else _order_view(order_row, customer_id)
        plan = judge(order, user)
        if isinstance(plan, Rejection):
            raise Refused(plan)
        self._apply(plan, user_row, order_row)
        after_user = _user_view(user_row) if plan.user_address or plan.balances else user
        after_order = None if order_row is None else _order_view(order_row, customer_id)
        result = dict(answer(after_order, after_user))
        Operation.objects.create(
            idempotency_key=key, tool=tool, subject=plan.subject, result=result
        )
        return result

    def _apply(self, plan: Plan, user: RetailUser, order: RetailOrder | None) -> None:
        for payment_method_id, delta in plan.balances:
            PaymentMethod.objects.filter(user=user, payment_method_id=payment_method_id).update(
                balance_cents=F("balance_cents") + delta
            )
        if plan.user_address is not None:
            for name, value in plan.user_address._asdict().items():
                setattr(user, name, value)
            user.save(update_fields=list(_ADDRESS))
        if order is None:
            return
        fields = dict(plan.order_fields)
        if plan.status is not None:
            fields["status"] = plan.status
        for name, value in fields.items():
            setattr(order, name, value)
        if fields:
            order.save(update_fields=list(fields))
        for position, line in plan.items:
            OrderItem.objects.filter(order=order, position=position).update(
                item_id=line.item_id, price_cents=line.price_cents, options=dict(line.options)
            )
        if plan.payments:
            start = Payment.objects.filter(order=order).count()
            Payment.objects.bulk_create(
                Payment(
                    order=order,
                    position=start + offset,
                    transaction_type=line.transaction_type,
                    amount_cents=line.amount_cents,
                    payment_method_id=line.payment_method_id,
                )
                for offset, line in enumerate(plan.payments)
            )

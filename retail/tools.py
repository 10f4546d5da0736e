"""The retail desk's sixteen tools, declared once: arguments (named as τ²-bench names them, so
that its gold actions validate), business check, handler, flags, the money a write moves and what
a reviewer sees of a held one.

The customer is the host's: the conversation's customer_id is the τ² user id the host
authenticated, and every user, order and payment method the tools touch is that user's or is not
found (docs/retail.md).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    Money,
    MoneyFromState,
    Refused,
    Rejection,
    Risk,
    ToolSpec,
)
from retail.book import (
    CURRENCY,
    GIFT_CARD_INSUFFICIENT_BALANCE,
    INVALID_EXPRESSION,
    ITEM_COUNT_MISMATCH,
    ITEM_NOT_FOUND,
    ITEM_NOT_IN_ORDER,
    ITEM_NOT_OF_PRODUCT,
    ITEM_UNAVAILABLE,
    ITEM_UNCHANGED,
    ORDER_ALREADY_MODIFIED,
    ORDER_NOT_DELIVERED,
    ORDER_NOT_FOUND,
    ORDER_NOT_PENDING,
    PAYMENT_METHOD_NOT_FOUND,
    PAYMENT_METHOD_UNCHANGED,
    PAYMENT_NOT_CHANGEABLE,
    PRODUCT_NOT_FOUND,
    REFUND_EXCEEDS_PAYMENT,
    REFUND_METHOD_NOT_ALLOWED,
    USER_NOT_FOUND,
    Address,
    OrderView,
    Plan,
    ProductView,
    UserView,
    VariantView,
    order_as_data,
    order_not_found,
    plan_cancel,
    plan_exchange,
    plan_modify_address,
    plan_modify_items,
    plan_modify_payment,
    plan_return,
    plan_user_address,
    product_as_data,
    user_as_data,
    user_not_found,
    variant_as_data,
)

ORDER_ID_PATTERN = r"^#[A-Za-z0-9]{1,16}$"
ITEM_ID_PATTERN = r"^[0-9]{1,16}$"
PAYMENT_METHOD_PATTERN = r"^(credit_card|paypal|gift_card)_[0-9]{1,16}$"
USER_ID_PATTERN = r"^[A-Za-z0-9_]{1,64}$"
EXPRESSION_PATTERN = r"^[0-9+\-*/(). ]{1,200}$"
MAX_ITEMS = 20

ItemId = Annotated[str, Field(pattern=ITEM_ID_PATTERN)]


class RetailBook(Protocol):
    def user(self, customer_id: str) -> UserView | None: ...
    def order(self, customer_id: str, order_id: str) -> OrderView | None: ...
    def product(self, product_id: str) -> ProductView | None: ...
    def variants(self, item_ids: Sequence[str]) -> dict[str, VariantView]: ...
    def product_types(self) -> dict[str, str]: ...
    def outcome(self, key: str) -> Mapping[str, Any] | None: ...
    def write(
        self,
        *,
        tool: str,
        key: str,
        customer_id: str,
        order_id: str | None,
        judge: Callable[[OrderView | None, UserView], Plan | Rejection],
        answer: Callable[[OrderView | None, UserView], Mapping[str, Any]],
    ) -> Mapping[str, Any]: ...


def _strict(title: str) -> ConfigDict:
    return ConfigDict(extra="forbid", strict=True, title=title)


def _order_id() -> Any:
    return Field(
        pattern=ORDER_ID_PATTERN,
        description="the order's id with its leading #, such as #W0000000",
    )


def _payment_method_id(description: str) -> Any:
    return Field(pattern=PAYMENT_METHOD_PATTERN, description=description)


def _item_ids(description: str) -> Any:
    return Field(min_length=1, max_length=MAX_ITEMS, description=description)


class FindUserIdByEmailArguments(BaseModel):
    model_config = _strict("find_user_id_by_email")

    email: str = Field(min_length=3, max_length=254, description="the user's email")


class FindUserIdByNameZipArguments(BaseModel):
    model_config = _strict("find_user_id_by_name_zip")

    first_name: str = Field(min_length=1, max_length=100, description="the user's first name")
    last_name: str = Field(min_length=1, max_length=100, description="the user's last name")
    zip: str = Field(min_length=1, max_length=20, description="the zip code of their address")


class GetUserDetailsArguments(BaseModel):
    model_config = _strict("get_user_details")

    user_id: str = Field(pattern=USER_ID_PATTERN, description="the user's id, such as sara_doe_496")


class GetOrderDetailsArguments(BaseModel):
    model_config = _strict("get_order_details")

    order_id: str = _order_id()


class GetProductDetailsArguments(BaseModel):
    model_config = _strict("get_product_details")

    product_id: str = Field(
        pattern=ITEM_ID_PATTERN,
        description="the product's id, such as 6086499569 (not an item id)",
    )


class GetItemDetailsArguments(BaseModel):
    model_config = _strict("get_item_details")

    item_id: str = Field(pattern=ITEM_ID_PATTERN, description="the item's id, such as 1008292230")


class ListAllProductTypesArguments(BaseModel):
    model_config = _strict("list_all_product_types")


class CalculateArguments(BaseModel):
    model_config = _strict("calculate")

    expression: str = Field(
        pattern=EXPRESSION_PATTERN,
        description="arithmetic on numbers with + - * / and parentheses, such as 2 * (3.5 + 1)",
    )


class CancelPendingOrderArguments(BaseModel):
    model_config = _strict("cancel_pending_order")

    order_id: str = _order_id()
    reason: Literal["no longer needed", "ordered by mistake"] = Field(
        description="why, as the user confirmed it: 'no longer needed' or 'ordered by mistake'"
    )


class _ItemChangeArguments(BaseModel):
    order_id: str = _order_id()
    item_ids: list[ItemId] = _item_ids(
        "the ids of the items to change, each as often as it is changed"
    )
    new_item_ids: list[ItemId] = _item_ids(
        "the new items, one per item above and in its order: another option of the same product"
    )
    payment_method_id: str = _payment_method_id(
        "the profile's payment method that pays or receives the price difference"
    )


class ModifyPendingOrderItemsArguments(_ItemChangeArguments):
    model_config = _strict("modify_pending_order_items")


class ExchangeDeliveredOrderItemsArguments(_ItemChangeArguments):
    model_config = _strict("exchange_delivered_order_items")


class _AddressArguments(BaseModel):
    address1: str = Field(min_length=1, max_length=200, description="street and number")
    address2: str = Field(max_length=200, description="apartment or suite; may be empty")
    city: str = Field(min_length=1, max_length=100)
    state: str = Field(min_length=1, max_length=100, description="such as CA")
    country: str = Field(min_length=1, max_length=100, description="such as USA")
    zip: str = Field(min_length=1, max_length=20)

    def address(self) -> Address:
        return Address(self.address1, self.address2, self.city, self.state, self.country, self.zip)


class ModifyPendingOrderAddressArguments(_AddressArguments):
    model_config = _strict("modify_pending_order_address")

    order_id: str = _order_id()


class ModifyUserAddressArguments(_AddressArguments):
    model_config = _strict("modify_user_address")

    user_id: str = Field(pattern=USER_ID_PATTERN, description="the user's id")


class ModifyPendingOrderPaymentArguments(BaseModel):
    model_config = _strict("modify_pending_order_payment")

    order_id: str = _order_id()
    payment_method_id: str = _payment_method_id(
        "the profile's payment method that pays the order instead (not the current one)"
    )


class ReturnDeliveredOrderItemsArguments(BaseModel):
    model_config = _strict("return_delivered_order_items")

    order_id: str = _order_id()
    item_ids: list[ItemId] = _item_ids("the ids of the items returned")
    payment_method_id: str = _payment_method_id(
        "where the refund goes: the original payment method or a gift card in the profile"
    )


class TransferToHumanAgentsArguments(BaseModel):
    model_config = _strict("transfer_to_human_agents")

    summary: str = Field(
        min_length=1, max_length=2000, description="the user's issue, for the human agent"
    )


# Arithmetic, evaluated without eval: numbers and + - * / // and parentheses only.
_OPERATORS: Mapping[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))  # type: ignore[no-any-return]
    raise ValueError("not arithmetic")


def calculated(expression: str) -> str:
    """The value, rounded to cents, as the benchmark's calculator writes it (str of a float)."""
    try:
        return str(round(float(_evaluate(ast.parse(expression, mode="eval"))), 2))
    # A chain of thousands of operators nests deeper than the parser or the walk may recurse.
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        raise Refused(
            Rejection(
                INVALID_EXPRESSION,
                f"expression: {expression!r} is not arithmetic this tool can compute (numbers, "
                "+ - * / and parentheses; no division by zero)",
            )
        ) from None


def _address_text(address: Address) -> str:
    parts = (address.address1, address.address2, address.city, address.state, address.zip)
    return ", ".join(part for part in parts if part) + f" ({address.country})"


def _method_text(user: UserView | None, payment_method_id: str) -> str:
    method = None if user is None else user.method(payment_method_id)
    if method is None:
        return payment_method_id
    if method.source == "credit_card":
        return f"{payment_method_id} ({method.brand} ending {method.last_four})"
    return payment_method_id


def order_review(order: OrderView | None, order_id: str, user: UserView | None) -> ReviewView:
    """The order as a reviewer glances at it before deciding: its status, what it holds, what
    was paid and with what."""
    if order is None:
        return ReviewView("Order", order_id, found=False, currency=CURRENCY)
    paid_with = ", ".join(
        dict.fromkeys(
            _method_text(user, p.payment_method_id)
            for p in order.payments
            if p.transaction_type == "payment"
        )
    )
    facts = [
        Fact("Status", order.status),
        Fact("Items", "; ".join(f"{i.name} {i.item_id}" for i in order.items)),
        Fact("Paid", order.paid_cents, FactKind.MONEY),
        Fact("Paid with", paid_with or "nothing"),
        Fact("Ships to", _address_text(order.address)),
    ]
    if user is not None:
        cards = [
            (m.payment_method_id, m.balance_cents)
            for m in user.payment_methods
            if m.gift_card and m.balance_cents is not None
        ]
        facts.extend(
            Fact(f"Gift card {pid} balance", cents, FactKind.MONEY) for pid, cents in cards
        )
    return ReviewView("Order", order.order_id, facts=tuple(facts), currency=CURRENCY)


CANCEL_WORDS = ToolWords(
    noun="cancellation", plural="cancellations", verb="refund", past="refunded"
)
# Items, payment or address of a pending order: one kind of change to a reviewer.
ORDER_CHANGE_WORDS = ToolWords(
    noun="order change", plural="order changes", verb="move", past="moved"
)
RETURN_WORDS = ToolWords(noun="return", plural="returns", verb="refund", past="refunded")
EXCHANGE_WORDS = ToolWords(noun="exchange", plural="exchanges", verb="move", past="moved")
ADDRESS_WORDS = ToolWords(
    noun="address change", plural="address changes", verb="change", past="changed"
)
TRANSFER_WORDS = ToolWords(noun="transfer", plural="transfers", verb="transfer", past="transferred")

RETAIL_TOOLS = (
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "get_product_details",
    "get_item_details",
    "list_all_product_types",
    "calculate",
    "cancel_pending_order",
    "modify_pending_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "modify_user_address",
    "transfer_to_human_agents",
)


_PENDING = (ORDER_NOT_FOUND, ORDER_NOT_PENDING, ORDER_ALREADY_MODIFIED)
_NEW_ITEMS = (
    ITEM_NOT_IN_ORDER,
    ITEM_COUNT_MISMATCH,
    ITEM_UNCHANGED,
    ITEM_NOT_OF_PRODUCT,
    ITEM_UNAVAILABLE,
    PAYMENT_METHOD_NOT_FOUND,
    GIFT_CARD_INSUFFICIENT_BALANCE,
    REFUND_EXCEEDS_PAYMENT,
)
# The business codes each tool may answer with (its check's and its handler's).
TOOL_CODES: dict[str, tuple[Code, ...]] = {
    "find_user_id_by_email": (USER_NOT_FOUND,),
    "find_user_id_by_name_zip": (USER_NOT_FOUND,),
    "get_user_details": (USER_NOT_FOUND,),
    "get_order_details": (ORDER_NOT_FOUND,),
    "get_product_details": (PRODUCT_NOT_FOUND,),
    "get_item_details": (ITEM_NOT_FOUND,),
    "list_all_product_types": (),
    "calculate": (INVALID_EXPRESSION,),
    "cancel_pending_order": (*_PENDING, PAYMENT_METHOD_NOT_FOUND),
    "modify_pending_order_items": (*_PENDING, *_NEW_ITEMS),
    "modify_pending_order_address": _PENDING,
    "modify_pending_order_payment": (
        *_PENDING,
        PAYMENT_METHOD_NOT_FOUND,
        PAYMENT_NOT_CHANGEABLE,
        PAYMENT_METHOD_UNCHANGED,
        GIFT_CARD_INSUFFICIENT_BALANCE,
    ),
    "return_delivered_order_items": (
        ORDER_NOT_FOUND,
        ORDER_NOT_DELIVERED,
        PAYMENT_METHOD_NOT_FOUND,
        REFUND_METHOD_NOT_ALLOWED,
        ITEM_NOT_IN_ORDER,
        REFUND_EXCEEDS_PAYMENT,
    ),
    "exchange_delivered_order_items": (ORDER_NOT_FOUND, ORDER_NOT_DELIVERED, *_NEW_ITEMS),
    "modify_user_address": (USER_NOT_FOUND,),
    "transfer_to_human_agents": (),
}


# A write's rule: its plan for the order (None for a user's own record) and the user.
Judge = Callable[[Any, OrderView | None, UserView], Plan | Rejection]


def retail_tools(book: RetailBook) -> tuple[ToolSpec[Any], ...]:
    def _user(customer_id: str) -> UserView | None:
        return book.user(customer_id)

    def _order_answer(order: OrderView | None, user: UserView) -> Mapping[str, Any]:
        assert order is not None
        return order_as_data(order)

    def _user_answer(order: OrderView | None, user: UserView) -> Mapping[str, Any]:
        return user_as_data(user)

    def _judged(judge: Judge, arguments: Any, customer_id: str) -> Plan | Rejection:
        user = _user(customer_id)
        order_id = getattr(arguments, "order_id", None)
        if user is None:
            return order_not_found(order_id) if order_id else user_not_found("user_id")
        order = None if order_id is None else book.order(customer_id, order_id)
        if order_id is not None and order is None:
            return order_not_found(order_id)
        return judge(arguments, order, user)

    def write_spec(
        name: str,
        label: str,
        description: str,
        arguments: type[BaseModel],
        judge: Judge,
        *,
        moves_money: bool,
        words: ToolWords,
        answer: Callable[[OrderView | None, UserView], Mapping[str, Any]] = _order_answer,
    ) -> ToolSpec[Any]:
        def check(args: Any, context: CheckContext) -> Rejection | None:
            plan = _judged(judge, args, context.customer_id)
            return plan if isinstance(plan, Rejection) else None

        def money(args: Any, context: CheckContext) -> Money | None:
            plan = _judged(judge, args, context.customer_id)
            if isinstance(plan, Rejection) or plan.money_cents is None:
                return None
            return Money(plan.money_cents, CURRENCY, plan.subject)

        def handler(args: Any, context: ExecutionContext) -> Mapping[str, Any]:
            return book.write(
                tool=name,
                key=context.idempotency_key,
                customer_id=context.customer_id,
                order_id=getattr(args, "order_id", None),
                judge=lambda order, user: judge(args, order, user),
                answer=answer,
            )

        def review(args: Any, customer_id: str) -> ReviewView:
            user = _user(customer_id)
            order_id = getattr(args, "order_id", None)
            if order_id is None:
                return user_review(user, customer_id)
            order = None if user is None else book.order(customer_id, order_id)
            return order_review(order, order_id, user)

        return ToolSpec(
            name=name,
            label=label,
            description=description,
            arguments=arguments,
            check=check,
            handler=handler,
            writes=True,
            # Every write is a human's to decide where the policy says so: by the money it
            # moves, or (an address) always, unless the policy lets it run.
            risk=Risk.HIGH,
            destructive=moves_money,
            idempotent=True,
            subject_field="order_id" if "order_id" in arguments.model_fields else "user_id",
            codes=TOOL_CODES[name],
            review=review,
            words=words,
            outcome_of=book.outcome,
            money=MoneyFromState(money) if moves_money else None,
        )

    def user_review(user: UserView | None, customer_id: str) -> ReviewView:
        if user is None:
            return ReviewView("User", customer_id, found=False, currency=CURRENCY)
        return ReviewView(
            "User",
            user.user_id,
            facts=(
                Fact("Name", f"{user.first_name} {user.last_name}"),
                Fact("Email", user.email),
                Fact("Address now", _address_text(user.address)),
                Fact("Orders", str(len(user.order_ids))),
            ),
            currency=CURRENCY,
        )

    def read_spec(
        name: str,
        label: str,
        description: str,
        arguments: type[BaseModel],
        handler: Callable[[Any, ExecutionContext], Mapping[str, Any]],
    ) -> ToolSpec[Any]:
        return ToolSpec(
            name=name,
            label=label,
            description=description,
            arguments=arguments,
            handler=handler,
            idempotent=True,
            codes=TOOL_CODES[name],
        )

    def find_by_email(args: FindUserIdByEmailArguments, context: ExecutionContext) -> Any:
        user = _user(context.customer_id)
        if user is None or user.email.lower() != args.email.lower():
            raise Refused(user_not_found("email"))
        return {"user_id": user.user_id}

    def find_by_name_zip(args: FindUserIdByNameZipArguments, context: ExecutionContext) -> Any:
        user = _user(context.customer_id)
        if (
            user is None
            or user.first_name.lower() != args.first_name.lower()
            or user.last_name.lower() != args.last_name.lower()
            or user.address.zip != args.zip
        ):
            raise Refused(user_not_found("first_name, last_name, zip"))
        return {"user_id": user.user_id}

    def user_details(args: GetUserDetailsArguments, context: ExecutionContext) -> Any:
        user = _user(context.customer_id) if args.user_id == context.customer_id else None
        if user is None:
            raise Refused(user_not_found("user_id"))
        return user_as_data(user)

    def order_details(args: GetOrderDetailsArguments, context: ExecutionContext) -> Any:
        order = book.order(context.customer_id, args.order_id)
        if order is None:
            raise Refused(order_not_found(args.order_id))
        return order_as_data(order)

    def product_details(args: GetProductDetailsArguments, context: ExecutionContext) -> Any:
        product = book.product(args.product_id)
        if product is None:
            raise Refused(
                Rejection(
                    PRODUCT_NOT_FOUND,
                    f"product_id: no product {args.product_id} (list_all_product_types gives "
                    "every product's id; an item id is not a product id)",
                )
            )
        return product_as_data(product)

    def item_details(args: GetItemDetailsArguments, context: ExecutionContext) -> Any:
        variant = book.variants([args.item_id]).get(args.item_id)
        if variant is None:
            raise Refused(
                Rejection(
                    ITEM_NOT_FOUND,
                    f"item_id: no item {args.item_id} (get_product_details lists a product's "
                    "items)",
                )
            )
        return variant_as_data(variant)

    def product_types(args: ListAllProductTypesArguments, context: ExecutionContext) -> Any:
        return book.product_types()

    def calculate(args: CalculateArguments, context: ExecutionContext) -> Any:
        return {"result": calculated(args.expression)}

    def transfer(args: TransferToHumanAgentsArguments, context: ExecutionContext) -> Any:
        return {"result": "Transfer successful"}

    def variants_of(args: _ItemChangeArguments) -> dict[str, VariantView]:
        return book.variants(args.new_item_ids)

    def cancel(args: CancelPendingOrderArguments, order: Any, user: UserView) -> Any:
        return plan_cancel(order, user, args.reason)

    def modify_items(args: ModifyPendingOrderItemsArguments, order: Any, user: UserView) -> Any:
        return plan_modify_items(
            order,
            user,
            args.item_ids,
            args.new_item_ids,
            args.payment_method_id,
            variants_of(args),
        )

    def modify_address(args: ModifyPendingOrderAddressArguments, order: Any, user: Any) -> Any:
        return plan_modify_address(order, args.address())

    def modify_payment(args: ModifyPendingOrderPaymentArguments, order: Any, user: UserView) -> Any:
        return plan_modify_payment(order, user, args.payment_method_id)

    def return_items(args: ReturnDeliveredOrderItemsArguments, order: Any, user: UserView) -> Any:
        return plan_return(order, user, args.item_ids, args.payment_method_id)

    def exchange(args: ExchangeDeliveredOrderItemsArguments, order: Any, user: UserView) -> Any:
        return plan_exchange(
            order,
            user,
            args.item_ids,
            args.new_item_ids,
            args.payment_method_id,
            variants_of(args),
        )

    def user_address(args: ModifyUserAddressArguments, order: Any, user: UserView) -> Any:
        if args.user_id != user.user_id:
            return user_not_found("user_id")
        return plan_user_address(user, args.address())

    return (
        read_spec(
            "find_user_id_by_email",
            "Find user by email",
            "Find the user id of the customer by their email. Read-only.",
            FindUserIdByEmailArguments,
            find_by_email,
        ),
        read_spec(
            "find_user_id_by_name_zip",
            "Find user by name and zip",
            "Find the user id of the customer by first name, last name and zip code. Read-only.",
            FindUserIdByNameZipArguments,
            find_by_name_zip,
        ),
        read_spec(
            "get_user_details",
            "Get user details",
            "The user's profile: name, address, email, payment methods and orders. Read-only.",
            GetUserDetailsArguments,
            user_details,
        ),
        read_spec(
            "get_order_details",
            "Get order details",
            "One of the user's orders: status, items, fulfilments and payment history (amounts "
            "in dollars). Read-only.",
            GetOrderDetailsArguments,
            order_details,
        ),
        read_spec(
            "get_product_details",
            "Get product details",
            "A product and its variant items: options, availability and price. Read-only.",
            GetProductDetailsArguments,
            product_details,
        ),
        read_spec(
            "get_item_details",
            "Get item details",
            "One variant item: options, availability and price. Read-only.",
            GetItemDetailsArguments,
            item_details,
        ),
        read_spec(
            "list_all_product_types",
            "List product types",
            "Every product's name and product id. Read-only.",
            ListAllProductTypesArguments,
            product_types,
        ),
        read_spec(
            "calculate",
            "Calculate",
            "Compute an arithmetic expression, rounded to cents. Read-only.",
            CalculateArguments,
            calculate,
        ),
        write_spec(
            "cancel_pending_order",
            "Cancel pending order",
            "Cancel one of the user's pending orders, for a reason the user confirmed; what was "
            "paid is refunded to the methods that paid it. Moves money; may be held for a human.",
            CancelPendingOrderArguments,
            cancel,
            moves_money=True,
            words=CANCEL_WORDS,
        ),
        write_spec(
            "modify_pending_order_items",
            "Modify pending order items",
            "Change items of a pending order to other available options of the same products, "
            "once per order; the price difference is paid or refunded with a method in the "
            "profile. Moves money; may be held for a human.",
            ModifyPendingOrderItemsArguments,
            modify_items,
            moves_money=True,
            words=ORDER_CHANGE_WORDS,
        ),
        write_spec(
            "modify_pending_order_address",
            "Modify pending order address",
            "Change the shipping address of a pending order. May be held for a human.",
            ModifyPendingOrderAddressArguments,
            modify_address,
            moves_money=False,
            words=ORDER_CHANGE_WORDS,
        ),
        write_spec(
            "modify_pending_order_payment",
            "Modify pending order payment",
            "Pay a pending order with another method in the profile; the original payment is "
            "refunded. Moves money; may be held for a human.",
            ModifyPendingOrderPaymentArguments,
            modify_payment,
            moves_money=True,
            words=ORDER_CHANGE_WORDS,
        ),
        write_spec(
            "return_delivered_order_items",
            "Return delivered order items",
            "Request the return of items of a delivered order, refunded to the original payment "
            "method or a gift card in the profile. Moves money; may be held for a human.",
            ReturnDeliveredOrderItemsArguments,
            return_items,
            moves_money=True,
            words=RETURN_WORDS,
        ),
        write_spec(
            "exchange_delivered_order_items",
            "Exchange delivered order items",
            "Request the exchange of items of a delivered order for other available options of "
            "the same products; the price difference is paid or refunded with a method in the "
            "profile. Moves money; may be held for a human.",
            ExchangeDeliveredOrderItemsArguments,
            exchange,
            moves_money=True,
            words=EXCHANGE_WORDS,
        ),
        write_spec(
            "modify_user_address",
            "Modify user address",
            "Change the user's default address. May be held for a human.",
            ModifyUserAddressArguments,
            user_address,
            moves_money=False,
            words=ADDRESS_WORDS,
            answer=_user_answer,
        ),
        ToolSpec(
            name="transfer_to_human_agents",
            label="Transfer to a human agent",
            description="Hand the conversation to a human agent, with a summary of the user's "
            "issue; only when the request is outside what the tools can do.",
            arguments=TransferToHumanAgentsArguments,
            handler=transfer,
            writes=True,
            idempotent=True,
            codes=(),
            words=TRANSFER_WORDS,
        ),
    )

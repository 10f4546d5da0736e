"""The retail desk through Toolgate's doors: its held calls in the reviewers' queue with their own
facts, decided and executed as a refund is; the what-if; MCP; the host's customer as the only
user; the writes once per key."""

from __future__ import annotations

import html
import re
from collections import Counter
from typing import Any

import anyio
import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.services import confirmation_reject
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.pipeline.tools import CheckContext, Money, Refused, Rejection
from dispatch.services import agent_create
from retail.book import OrderView, Plan, UserView, plan_cancel
from retail.gateway import OrmRetailBook
from retail.models import Operation, PaymentMethod, RetailOrder, RetailUser
from retail.tools import RETAIL_TOOLS, calculated, retail_tools
from tests.analytics.test_views import login_in_group
from tests.approvals.test_pages import text
from tests.dispatch.test_mcp import http_connect, mcp_url  # noqa: F401  (its fixture)
from tests.retail.conftest import RetailCall

pytestmark = pytest.mark.django_db

# A pending order of $182.03 paid with PayPal, and one of $1,137.45 paid with a gift card.
PAYPAL_CUSTOMER, PAYPAL_ORDER = "fatima_anderson_2157", "#W2974929"
CANCEL = {"order_id": PAYPAL_ORDER, "reason": "no longer needed"}


@pytest.fixture
def desk_agent(db: None) -> tuple[Agent, str]:
    """The demo's shape of policy: without a human below $50, else held for a reviewer."""
    return agent_create(
        name="retail-desk-reviewed",
        allowed_tools=RETAIL_TOOLS,
        max_amount_cents=500_000,
        auto_approve_below_cents=5_000,
    )


def post(client: Client, token: str, tool: str, arguments: dict[str, Any], **host: str) -> Any:
    envelope = {
        "session_id": host.get("session", "s-1"),
        "customer_id": host.get("customer", PAYPAL_CUSTOMER),
        "tool": tool,
        "arguments": arguments,
    }
    response = client.post(
        "/api/v1/calls",
        envelope,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    return response.json()


def reviewer() -> User:
    user = User.objects.create_user("rita", password="pw")
    user.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    return user


@pytest.mark.django_db(transaction=True)
def test_a_held_cancellation_shows_its_order_and_is_executed_once_a_reviewer_approves(
    retail_db: dict[str, Any], desk_agent: tuple[Agent, str]
) -> None:
    agent_client = Client()
    held = post(agent_client, desk_agent[1], "cancel_pending_order", CANCEL)
    browser = Client()
    browser.force_login(reviewer())
    queue = text(browser.get("/approvals/"))

    response = browser.post(f"/approvals/{held['data']['confirmation_id']}/approve", follow=True)

    assert held["code"] == "CONFIRMATION_REQUIRED"
    assert "$182.03 Cancel pending order · #W2974929" in queue
    assert "Status pending" in queue and "Items Skateboard 3877188862" in queue
    assert "Paid $182.03 Paid with paypal_7916550" in queue
    assert "$182.03 is not below $50.00, the most this agent may move without a human" in queue
    assert "refund" not in queue.split("Why it was held", 1)[1].split("Approvals", 1)[0]
    assert "Executed: Cancel pending order $182.03 #W2974929." in text(response)
    order = RetailOrder.objects.get(order_id=PAYPAL_ORDER)
    assert (order.status, order.cancel_reason) == ("cancelled", "no longer needed")
    assert list(order.payments.values_list("transaction_type", "amount_cents")) == [
        ("payment", 18_203),
        ("refund", 18_203),
    ]


def test_a_rejected_cancellation_changes_nothing_and_the_history_names_it(
    client: Client, retail_db: dict[str, Any], desk_agent: tuple[Agent, str]
) -> None:
    held = post(client, desk_agent[1], "cancel_pending_order", CANCEL)
    rita = reviewer()
    confirmation_reject(
        confirmation_id=held["data"]["confirmation_id"], reviewer=rita, reason="Ask first"
    )
    client.force_login(rita)

    page = text(client.get("/approvals/history/"))

    assert "$182.03 Cancel pending order · #W2974929" in page and "Ask first" in page
    assert Confirmation.objects.get().status == ConfirmationStatus.REJECTED
    assert RetailOrder.objects.get(order_id=PAYPAL_ORDER).status == "pending"


def test_an_address_change_moves_no_money_and_is_held_for_a_human(
    client: Client, retail_db: dict[str, Any], desk_agent: tuple[Agent, str]
) -> None:
    address = {
        "address1": "1 Main St",
        "address2": "",
        "city": "Austin",
        "state": "TX",
        "country": "USA",
        "zip": "73301",
    }

    held = post(
        client, desk_agent[1], "modify_pending_order_address", {"order_id": PAYPAL_ORDER, **address}
    )

    assert held["code"] == "CONFIRMATION_REQUIRED"
    assert Confirmation.objects.get().amount_cents is None
    assert RetailOrder.objects.get(order_id=PAYPAL_ORDER).city == "Jacksonville"


def test_the_what_if_judges_retail_calls_again_under_a_draft(
    retail_db: dict[str, Any], desk_agent: tuple[Agent, str]
) -> None:
    client = Client()
    # $49.67 runs without a human; $182.03 is held. Their money is the orders' state: the what-if
    # reads what each call reserved or was held for.
    small = {"order_id": "#W3525030", "reason": "ordered by mistake"}
    ran = post(
        client,
        desk_agent[1],
        "cancel_pending_order",
        small,
        customer="harper_johansson_2663",
        session="s-2",
    )
    held = post(client, desk_agent[1], "cancel_pending_order", CANCEL)
    manager = login_in_group("max", "managers")

    def moves(auto_approve_below: str) -> list[tuple[str, str]]:
        response = manager.get(
            "/analytics/what-if/",
            {
                "agent": str(desk_agent[0].pk),
                "range": "24h",
                "USD_auto_approve_below": auto_approve_below,
            },
        )
        assert response.status_code == 200
        return [(move["actual"], move["draft"]) for move in response.context["moves"]]

    assert (ran["code"], held["code"]) == ("OK", "CONFIRMATION_REQUIRED"), (ran, held)
    assert moves("200") == [("Held for one reviewer", "Auto-executed")]
    assert moves("40") == [("Auto-executed", "Held for one reviewer")]


def test_another_users_email_finds_no_user_though_it_exists(
    retail_db: dict[str, Any], retail_call: RetailCall
) -> None:
    answer = retail_call(
        "find_user_id_by_email",
        {"email": "fatima.anderson1447@example.com"},
        customer="yusuf_rossi_9620",
    )

    assert (answer["ok"], answer["code"]) == (False, "USER_NOT_FOUND")


def test_a_repeated_key_answers_the_first_write_and_changes_nothing_more(
    retail_db: dict[str, Any],
) -> None:
    book = OrmRetailBook()

    def judge(order: OrderView | None, user: UserView) -> Plan | Rejection:
        assert order is not None
        return plan_cancel(order, user, "no longer needed")

    def cancel() -> Any:
        return book.write(
            tool="cancel_pending_order",
            key="key-1",
            customer_id=PAYPAL_CUSTOMER,
            order_id=PAYPAL_ORDER,
            judge=judge,
            answer=lambda order, user: {"status": order.status if order else None},
        )

    first, second = cancel(), cancel()

    assert first == second == {"status": "cancelled"}
    order = RetailOrder.objects.get(order_id=PAYPAL_ORDER)
    assert order.payments.count() == 2
    assert Operation.objects.exclude(tool="load_retail").count() == 1


def test_a_gift_card_is_refunded_at_once_on_a_cancellation(
    retail_db: dict[str, Any], retail_call: RetailCall
) -> None:
    order = RetailOrder.objects.filter(
        status="pending", payments__payment_method_id__startswith="gift_card"
    ).first()
    assert order is not None
    [paid] = order.payments.all()
    card = PaymentMethod.objects.get(user=order.user, payment_method_id=paid.payment_method_id)
    balance = card.balance_cents
    assert balance is not None

    answer = retail_call(
        "cancel_pending_order",
        {"order_id": order.order_id, "reason": "ordered by mistake"},
        customer=order.user.user_id,
    )

    assert answer["ok"], answer
    card.refresh_from_db()
    assert card.balance_cents == balance + paid.amount_cents


def test_calculate_takes_arithmetic_only() -> None:
    assert calculated("155.33 - 147.05 + 268.77 - 235.13") == "41.92"
    # The last: a chain deeper than Python's parser recurses (the schema's 200 characters keep
    # the API's far below it; the calculator refuses it on its own too).
    for expression in ("2 ** 3", "1 / 0", "()", "1 +", "1+" * 3000 + "1"):
        with pytest.raises(Refused) as refused:
            calculated(expression)
        assert refused.value.rejection.code.name == "INVALID_EXPRESSION"


@pytest.mark.django_db(transaction=True)
def test_mcp_serves_the_retail_tools_as_it_serves_the_order_tools(
    mcp_url: str,  # noqa: F811
    retail_db: dict[str, Any],
    retail_agent: tuple[Agent, str],
) -> None:
    connect = http_connect(mcp_url)

    async def steps() -> tuple[list[Any], Any]:
        async with connect(retail_agent[1], customer=PAYPAL_CUSTOMER) as client:
            tools = (await client.list_tools()).tools
            answer = await client.call_tool("get_order_details", {"order_id": PAYPAL_ORDER})
            return tools, answer

    tools, answer = anyio.run(steps)

    assert [tool.name for tool in tools] == list(RETAIL_TOOLS)
    by_name = {tool.name: tool for tool in tools}
    assert by_name["get_order_details"].annotations.read_only_hint is True
    assert by_name["cancel_pending_order"].annotations.destructive_hint is True
    assert by_name["modify_user_address"].annotations.destructive_hint is False
    assert answer.is_error is False
    assert answer.structured_content["data"]["status"] == "pending"


class _CountingBook(OrmRetailBook):
    """The database's book, counting its reads of users and orders."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()

    def user(self, customer_id: str) -> UserView | None:
        self.reads["user"] += 1
        return super().user(customer_id)

    def order(self, customer_id: str, order_id: str) -> OrderView | None:
        self.reads["order"] += 1
        return super().order(customer_id, order_id)


def test_a_writes_check_and_its_money_judge_its_plan_once(retail_db: dict[str, Any]) -> None:
    book = _CountingBook()
    [spec] = [spec for spec in retail_tools(book) if spec.name == "cancel_pending_order"]
    assert spec.check is not None and spec.money is not None
    arguments = spec.arguments.model_validate(CANCEL)
    context = CheckContext(PAYPAL_CUSTOMER)

    # As the gate asks: the check, then the money of the call that passed it.
    refusal = spec.check(arguments, context)
    money = spec.money_of(arguments, context)
    judged_once = book.reads.copy()
    # Asked again without a check, the money is judged afresh: the kept plan serves one call.
    again = spec.money_of(arguments, context)

    assert refusal is None
    assert money == again == Money(18_203, "USD", PAYPAL_ORDER)
    assert judged_once == Counter(user=1, order=1)
    assert book.reads == Counter(user=2, order=2)


def test_a_held_calls_their_orders_leads_to_the_customers_retail_orders(
    client: Client, retail_db: dict[str, Any], desk_agent: tuple[Agent, str]
) -> None:
    held = post(client, desk_agent[1], "cancel_pending_order", CANCEL)
    manager = User.objects.create_user("maria", password="pw")
    manager.groups.add(Group.objects.get_or_create(name="managers")[0])
    client.force_login(manager)
    confirmation = client.get(f"/records/confirmations/{held['data']['confirmation_id']}/")
    [their_orders] = re.findall(r'href="([^"]+)">their orders<', confirmation.content.decode())

    orders = client.get(html.unescape(their_orders))
    everyone = text(client.get("/records/orders/"))
    by_order = text(client.get("/records/orders/", {"customer": PAYPAL_CUSTOMER, "order": "W29"}))

    assert held["code"] == "CONFIRMATION_REQUIRED"
    assert their_orders == f"/records/orders/?customer={PAYPAL_CUSTOMER}"
    page = text(orders)
    assert f"Retail desk: orders of {PAYPAL_CUSTOMER}" in page
    assert "Order Status Items Paid Paid with Ships to" in page
    assert "#W2974929 pending Skateboard 3877188862 $182.03 paypal_7916550" in page
    # Every one of the customer's orders, and no one else's.
    user = RetailUser.objects.get(user_id=PAYPAL_CUSTOMER)
    shown = re.findall(r"#W\d+", page)
    assert shown == list(user.orders.order_by("user_position").values_list("order_id", flat=True))
    assert "#W2974929" in by_order and len(re.findall(r"#W\d+", by_order)) == 1
    assert "orders of" not in everyone and "listed by customer: filter by one" in everyone

"""What a money check reads cannot be rewritten by the application's role (PostgreSQL).

As someone holding the web processes' database credentials would: an order's total, currency,
customer and id once it has a refund, its refunded_cents without a ledger row, the retail desk's
gift card balances, payment lines and item prices without the operation that records them. The
product's own paths still work as that role: refunds and retail writes through the API, and an
order edited before its first refund, as the admin does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from psycopg import errors

from tests.conftest import AgentClient, printed_token
from tests.deploy.conftest import App, Site
from tests.deploy.site import DIRECT_HEADERS


def _as_app(site: Site, statement: str) -> None:
    with site.database.connect(site.database.app) as connection:
        connection.execute(statement)


@pytest.fixture(scope="module")
def refunded(site_app: App) -> str:
    """An order with one refund, made through the API."""
    database = site_app.site.database
    order_id = database.order_create(total_cents=12_000, customer_id="CUS-920")
    result = site_app.client().refund(
        1000, order_id=order_id, session="guards-1", customer="CUS-920"
    )
    assert (result["ok"], database.ledger(order_id)) == (True, (1, 1000, 1000))
    return order_id


def _order(site: Site, order_id: str) -> tuple[object, ...]:
    with site.database.connect(site.database.owner) as connection:
        row = connection.execute(
            "SELECT order_id, customer_id, total_cents, currency, refunded_cents FROM orders_order "
            "WHERE order_id = %s",
            [order_id],
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    "change",
    [
        "total_cents = total_cents + 100000",
        "currency = 'USD'",
        "customer_id = 'CUS-921'",
        "order_id = 'ORD-99999'",
    ],
)
def test_the_application_role_cannot_change_what_a_refund_was_judged_against(
    site_app: App, refunded: str, change: str
) -> None:
    site = site_app.site
    before = _order(site, refunded)

    with pytest.raises(errors.InsufficientPrivilege, match="has rows in orders_refund"):
        _as_app(site, f"UPDATE orders_order SET {change} WHERE order_id = '{refunded}'")

    assert _order(site, refunded) == before
    assert site.database.ledger(refunded) == (1, 1000, 1000)


def test_the_application_role_cannot_set_refunded_cents_back_to_zero(
    site_app: App, refunded: str
) -> None:
    site = site_app.site

    with pytest.raises(errors.CheckViolation, match="ledger rows add up to 1000"):
        _as_app(site, f"UPDATE orders_order SET refunded_cents = 0 WHERE order_id = '{refunded}'")

    assert site.database.ledger(refunded) == (1, 1000, 1000)


def test_an_order_is_edited_as_the_admin_does_until_its_first_refund_then_refunded(
    site_app: App,
) -> None:
    site = site_app.site
    order_id = site.database.order_create(total_cents=3_000, customer_id="CUS-922")

    # What the admin's save of a changed total and customer sends, as the application role.
    _as_app(
        site,
        "UPDATE orders_order SET total_cents = 9000, customer_id = 'CUS-923' "
        f"WHERE order_id = '{order_id}'",
    )
    result = site_app.client().refund(
        4_000, order_id=order_id, session="guards-2", customer="CUS-923"
    )

    assert (result["ok"], result["code"]) == (True, "OK")
    assert _order(site, order_id) == (order_id, "CUS-923", 9_000, "BRL", 4_000)
    assert site.database.ledger(order_id) == (1, 4_000, 4_000)


@dataclass(frozen=True)
class Desk:
    token: str
    user_id: str
    order_id: str
    card_id: str
    paid_cents: int


@pytest.fixture(scope="module")
def desk(site_app: App) -> Desk:
    """The retail desk loaded as the owner (docs/deploy.md), an agent for it, and a pending order
    paid with a gift card."""
    production, database = site_app.site.production, site_app.site.database
    production.manage("load_retail")
    output = production.manage(
        "create_agent",
        "site-desk",
        "--tools",
        "cancel_pending_order",
        "get_order_details",
        "--auto-approve-below",
        "USD:100000",
        "--max-amount",
        "USD:100000",
    )
    with database.connect(database.owner) as connection:
        row = connection.execute(
            "SELECT u.user_id, o.order_id, p.payment_method_id, p.amount_cents "
            "FROM retail_retailorder o JOIN retail_retailuser u ON u.id = o.user_id "
            "JOIN retail_payment p ON p.order_id = o.id "
            "WHERE o.status = 'pending' AND p.payment_method_id LIKE 'gift_card%%' "
            "AND (SELECT count(*) FROM retail_payment q WHERE q.order_id = o.id) = 1 "
            "ORDER BY o.id LIMIT 1"
        ).fetchone()
    assert row is not None
    return Desk(printed_token(output), *row)


def _balance(site: Site, desk: Desk) -> int:
    with site.database.connect(site.database.owner) as connection:
        row = connection.execute(
            "SELECT m.balance_cents FROM retail_paymentmethod m "
            "JOIN retail_retailuser u ON u.id = m.user_id "
            "WHERE u.user_id = %s AND m.payment_method_id = %s",
            [desk.user_id, desk.card_id],
        ).fetchone()
    assert row is not None
    return int(row[0])


def _desk_state(site: Site) -> tuple[object, ...]:
    with site.database.connect(site.database.owner) as connection:
        row = connection.execute(
            "SELECT (SELECT sum(balance_cents) FROM retail_paymentmethod), "
            "(SELECT count(*) || ':' || sum(amount_cents) FROM retail_payment), "
            "(SELECT sum(price_cents) FROM retail_orderitem), "
            "(SELECT count(*) FROM retail_operation)"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    ("statement", "refusal"),
    [
        (
            "UPDATE retail_paymentmethod SET balance_cents = balance_cents + 100000 "
            "WHERE balance_cents IS NOT NULL",
            errors.CheckViolation,
        ),
        (
            "INSERT INTO retail_paymentmethod (user_id, payment_method_id, source, brand, "
            "last_four, balance_cents, position) SELECT id, 'gift_card_0000001', 'gift_card', '', "
            "'', 100000000, 99 FROM retail_retailuser LIMIT 1",
            errors.CheckViolation,
        ),
        (
            "INSERT INTO retail_payment (order_id, position, transaction_type, amount_cents, "
            "payment_method_id) SELECT id, 99, 'payment', 100000, 'gift_card_0' "
            "FROM retail_retailorder LIMIT 1",
            errors.CheckViolation,
        ),
        ("UPDATE retail_orderitem SET price_cents = price_cents * 10", errors.CheckViolation),
        (
            "UPDATE retail_payment SET amount_cents = amount_cents * 10",
            errors.InsufficientPrivilege,
        ),
        ("DELETE FROM retail_payment", errors.InsufficientPrivilege),
        ("UPDATE retail_operation SET result = '{}'", errors.InsufficientPrivilege),
        ("DELETE FROM retail_operation", errors.InsufficientPrivilege),
    ],
)
def test_the_application_role_cannot_move_the_desks_money_without_its_operation(
    site_app: App, desk: Desk, statement: str, refusal: type[Exception]
) -> None:
    site = site_app.site
    before = _desk_state(site)

    with pytest.raises(refusal):
        _as_app(site, statement)

    assert _desk_state(site) == before


def test_a_retail_write_through_the_api_moves_the_balance_with_its_operation(
    site_app: App, desk: Desk
) -> None:
    database = site_app.site.database
    client = AgentClient(site_app.url, desk.token)
    client.http.headers.update(DIRECT_HEADERS)
    balance = _balance(site_app.site, desk)

    result = client.call(
        "cancel_pending_order",
        {"order_id": desk.order_id, "reason": "no longer needed"},
        session="guards-desk",
        customer=desk.user_id,
    )

    assert (result["ok"], result["code"]) == (True, "OK"), result
    with database.connect(database.owner) as connection:
        moved = connection.execute(
            "SELECT p.transaction_type, p.amount_cents FROM retail_payment p "
            "JOIN retail_retailorder o ON o.id = p.order_id WHERE o.order_id = %s "
            "ORDER BY p.position",
            [desk.order_id],
        ).fetchall()
        recorded = connection.execute(
            "SELECT count(*) FROM retail_operation WHERE tool = 'cancel_pending_order' "
            "AND subject = %s AND transaction_id IS NOT NULL",
            [desk.order_id],
        ).fetchone()
    assert _balance(site_app.site, desk) == balance + desk.paid_cents
    assert moved == [("payment", desk.paid_cents), ("refund", desk.paid_cents)]
    assert recorded == (1,)

"""The invariants of the books, each one set-based statement (PostgreSQL) that returns its
breaches: over every row (a full sweep), or over the rows that changed since the runs before
(`changed`, the ids above each followed table's mark, books/reconciler.py).

- order_ledger: an order's refunded_cents is the sum of its refund ledger, within its total;
- retail_refund_beyond_payment: no payment method of a retail order got back more than it paid
  the order (retail/book.py, `net_paid`);
- execution_ledger: an executed confirmation has its ledger row (under its execution key) in the
  system of record its tool's domain declares, and a confirmation that did not execute has none;
- customer_window: what moved without a human for a customer in a currency, within the policy's
  window ending at each such movement, stays below the policy's auto-approve line;
- approver_limit: every approval was made by a reviewer whose limit in the currency covers the
  customer's sum it was judged on (or who has no limit in it).

Each is a necessary condition of what the pipeline enforces, so a clean system finds none: the
customer's sum here counts only the money moved without a human (the pipeline counted more),
an approver's limit is read as it stands now, and a movement's policy is the version in force
at its time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import connection
from django.db.models import Field
from django.urls import reverse
from django.utils.http import urlencode

from dispatch.models import ConfirmationStatus
from dispatch.pipeline.tools import Risk
from dispatch.registry import tool_registry

# The tables whose new rows a run over what changed follows, by primary key.
FOLLOWED = (
    "orders_refund",
    "retail_payment",
    "dispatch_movement",
    "approvals_confirmationevent",
)


@dataclass(frozen=True)
class Found:
    """One breach as a check reports it."""

    invariant: str
    subject: str
    detail: str
    look_at: str


@dataclass(frozen=True)
class Check:
    invariant: str
    # What it means in an administrator's words, and where to look.
    words: str
    # The statement; each of its placeholders in `changed` is "" for a full sweep, and its
    # restriction to what changed otherwise (whose parameters are the marks, `<table>_after`).
    statement: str
    changed: dict[str, str]
    found: Callable[[Sequence[Any]], Found]
    params: Callable[[], dict[str, Any]] = dict
    # What a placeholder of `changed` is in a full sweep, where not "".
    swept: dict[str, str] = field(default_factory=dict)


def _order_url(order_id: str) -> str:
    return reverse("records:order", args=[order_id])


def _confirmation_url(confirmation_id: str) -> str:
    return reverse("records:confirmation", args=[confirmation_id])


def _customer_url(customer_id: str) -> str:
    return reverse("records:confirmations") + "?" + urlencode({"customer": customer_id})


# Orders ----------------------------------------------------------------------------------------

# The sum is computed once per order, and judged outside.
ORDER_LEDGER = Check(
    "order_ledger",
    "an order's refunded amount is not the sum of its refund ledger, or is above its total",
    """
    SELECT * FROM (
        SELECT o.order_id, o.currency, o.total_cents, o.refunded_cents,
            COALESCE((SELECT SUM(r.amount_cents) FROM orders_refund r WHERE r.order_id = o.id),
                0) AS ledger
        FROM orders_order o
        WHERE true {changed}
    ) AS books
    WHERE refunded_cents <> ledger OR refunded_cents > total_cents
    """,
    {
        "changed": "AND o.id IN "
        "(SELECT order_id FROM orders_refund WHERE id > %(orders_refund_after)s)"
    },
    lambda row: Found(
        "order_ledger",
        f"order {row[0]}",
        f"refunded {row[3]} {row[1]}, ledger {row[4]}, total {row[2]}",
        _order_url(row[0]),
    ),
)

RETAIL_REFUND_BEYOND_PAYMENT = Check(
    "retail_refund_beyond_payment",
    "a payment method of a retail order got back more than it paid the order",
    """
    SELECT o.order_id, p.payment_method_id, u.user_id,
        SUM(CASE WHEN p.transaction_type = 'payment' THEN p.amount_cents
            ELSE -p.amount_cents END) AS net
    FROM retail_payment p
        JOIN retail_retailorder o ON o.id = p.order_id
        JOIN retail_retailuser u ON u.id = o.user_id
    WHERE true {changed}
    GROUP BY o.order_id, u.user_id, p.payment_method_id
    HAVING SUM(CASE WHEN p.transaction_type = 'payment' THEN p.amount_cents
        ELSE -p.amount_cents END) < 0
    """,
    {
        "changed": "AND p.order_id IN "
        "(SELECT order_id FROM retail_payment WHERE id > %(retail_payment_after)s)"
    },
    lambda row: Found(
        "retail_refund_beyond_payment",
        f"retail order {row[0]} / {row[1]}",
        f"{row[1]} got back {-int(row[3])} more than it paid order {row[0]}",
        reverse("records:orders") + "?" + urlencode({"customer": row[2], "order": row[0]}),
    ),
)


# Executions and their ledgers ------------------------------------------------------------------


def _ledgers() -> list[tuple[str, str, tuple[str, ...]]]:
    """(table, key column, tools) of each domain that declares the system of record its tools'
    executions write one row to, under their execution key (AppConfig.execution_ledger)."""
    found: list[tuple[str, str, tuple[str, ...]]] = []
    for config in apps.get_app_configs():
        declared = getattr(config, "execution_ledger", None)
        if declared is None:
            continue
        model_name, key_field, tools = declared
        model = config.get_model(model_name)
        field = model._meta.get_field(key_field)
        assert isinstance(field, Field)
        found.append((model._meta.db_table, str(field.column), tuple(tools)))
    return found


_EXECUTION_KEY = "encode(sha256(convert_to('confirmation:' || c.id, 'UTF8')), 'hex')"
# The execution wrote, or may have written, its row.
_MAY_HAVE_EXECUTED = (
    ConfirmationStatus.EXECUTED,
    ConfirmationStatus.EXECUTING,
    ConfirmationStatus.UNKNOWN,
)


def _execution_check() -> Check:
    """Executed without its ledger row; or a ledger row under the execution key of a
    confirmation that did not execute. Over what changed: the confirmations whose log moved,
    and the ledgers' new rows (through their money's row, which has the same key)."""
    parts = []
    # Over what changed, the confirmations are read from their log's new events, each by its
    # key (OFFSET 0 keeps the planner from trading the lookups for a scan of every one).
    changed = {
        "confirmations": "(SELECT DISTINCT confirmation_id FROM approvals_confirmationevent "
        "WHERE id > %(approvals_confirmationevent_after)s) AS moved CROSS JOIN LATERAL "
        "(SELECT * FROM dispatch_confirmation WHERE id = moved.confirmation_id OFFSET 0) AS c"
    }
    swept = {"confirmations": "dispatch_confirmation c"}
    quote = connection.ops.quote_name
    statuses = ", ".join(f"'{status}'" for status in _MAY_HAVE_EXECUTED)
    for table, column, tools in _ledgers():
        names = ", ".join(f"'{tool}'" for tool in sorted(tools)) or "''"
        key = f"l.{quote(column)}"
        changed[table] = f"AND l.id > %({table}_after)s"
        # The sweep finds those by the confirmations already.
        swept[table] = "AND false"
        parts.append(
            f"""
            SELECT c.id, c.tool, c.status, 'executed, and no ledger row' AS what
            FROM {{confirmations}}
            WHERE c.status = '{ConfirmationStatus.EXECUTED}' AND c.tool IN ({names})
                AND NOT EXISTS (SELECT 1 FROM {quote(table)} l WHERE {key} = {_EXECUTION_KEY})
            UNION
            SELECT c.id, c.tool, c.status, 'a ledger row, and not executed' AS what
            FROM {{confirmations}} JOIN {quote(table)} l ON {key} = {_EXECUTION_KEY}
            WHERE c.status NOT IN ({statuses}) AND c.tool IN ({names})
            UNION
            SELECT c.id, c.tool, c.status, 'a ledger row, and not executed' AS what
            FROM {quote(table)} l
                CROSS JOIN LATERAL (SELECT confirmation_id FROM dispatch_movement
                    WHERE key = {key} AND confirmation_id <> '' OFFSET 0) AS m
                CROSS JOIN LATERAL (SELECT * FROM dispatch_confirmation
                    WHERE id = m.confirmation_id OFFSET 0) AS c
            WHERE c.status NOT IN ({statuses}) {{{table}}}
            """
        )
    return Check(
        EXECUTION_LEDGER.invariant,
        EXECUTION_LEDGER.words,
        " UNION ".join(parts) or "SELECT NULL, NULL, NULL, NULL WHERE false",
        changed,
        EXECUTION_LEDGER.found,
        swept=swept,
    )


EXECUTION_LEDGER = Check(
    "execution_ledger",
    "an executed confirmation has no ledger row, or a confirmation that did not execute has one",
    "",
    {},
    lambda row: Found(
        "execution_ledger",
        f"confirmation {row[0]}",
        f"{row[1]} {row[2]}: {row[3]}",
        _confirmation_url(row[0]),
    ),
)

# Money moved without a human ------------------------------------------------------------------

CUSTOMER_WINDOW = Check(
    "customer_window",
    "money moved without a human for a customer reached the policy's line within its window",
    """
    SELECT m.customer_id, m.currency, m.key, m.at, sums.cents, policy.line, policy.version,
        m.agent_id
    FROM dispatch_movement m
    CROSS JOIN LATERAL (
        SELECT p.version, p.auto_approve_window_seconds AS window_seconds,
            COALESCE(p.human_rules ->> m.tool,
                CASE WHEN m.tool = ANY(%(high_risk)s) THEN 'by_amount' ELSE 'never' END) AS rule,
            CASE WHEN p.currency_limits IS NULL THEN p.auto_approve_below_cents
                ELSE (p.currency_limits -> m.currency ->> 'auto_approve_below_cents')::bigint
            END AS line
        FROM dispatch_policy p
        WHERE p.agent_id = m.agent_id AND p.created_at <= m.at
        ORDER BY p.version DESC LIMIT 1
    ) AS policy
    CROSS JOIN LATERAL (
        SELECT COALESCE(SUM(o.amount_cents), 0) AS cents FROM dispatch_movement o
        WHERE o.customer_id = m.customer_id AND o.currency = m.currency
            AND o.approval = 'policy' AND o.released_at IS NULL
            AND o.at >= m.at - make_interval(secs => policy.window_seconds) AND o.at <= m.at
    ) AS sums
    WHERE m.approval = 'policy' AND m.released_at IS NULL AND policy.rule = 'by_amount'
        AND sums.cents >= COALESCE(policy.line, 0) {changed}
    """,
    {"changed": "AND m.id > %(dispatch_movement_after)s"},
    lambda row: Found(
        "customer_window",
        f"customer {row[0]} {row[1]} at {row[3].isoformat(timespec='seconds')}",
        f"{row[4]} {row[1]} moved without a human within the window of policy v{row[6]} of agent "
        f"{row[7]}, not below its line of {row[5]} (movement {row[2][:12]})",
        _customer_url(row[0]),
    ),
    lambda: {
        "high_risk": [spec.name for spec in tool_registry if spec.risk is Risk.HIGH],
    },
)


# Approvals -------------------------------------------------------------------------------------

APPROVER_LIMIT = Check(
    "approver_limit",
    "a confirmation was approved with no approver whose limit covers the sum it was judged on",
    """
    SELECT c.id, c.currency, need.cents, e.actor_label
    FROM approvals_confirmationevent e
        JOIN dispatch_confirmation c ON c.id = e.confirmation_id
        CROSS JOIN LATERAL (
            SELECT COALESCE((e.data ->> 'sum_cents')::bigint, c.amount_cents) AS cents
        ) AS need
    WHERE e.kind = 'approved' AND c.amount_cents IS NOT NULL
        AND NOT EXISTS (
            SELECT 1 FROM approvals_vote v
                LEFT JOIN approvals_reviewerlimit l
                    ON l.reviewer_id = v.reviewer_id AND l.currency = c.currency
            WHERE v.confirmation_id = c.id AND v.at <= e.at
                AND (l.id IS NULL OR l.max_amount_cents >= need.cents)) {changed}
    """,
    {"changed": "AND e.id > %(approvals_confirmationevent_after)s"},
    lambda row: Found(
        "approver_limit",
        f"confirmation {row[0]}",
        f"approved (last by {row[3]}) on a sum of {row[2]} {row[1]}, and no approver's limit "
        "covers it",
        _confirmation_url(row[0]),
    ),
)


def followed() -> tuple[str, ...]:
    """The tables whose new rows a run over what changed follows, by primary key."""
    return (*FOLLOWED, *(table for table, _, _ in _ledgers() if table not in FOLLOWED))


def checks() -> list[Check]:
    return [
        ORDER_LEDGER,
        RETAIL_REFUND_BEYOND_PAYMENT,
        _execution_check(),
        CUSTOMER_WINDOW,
        APPROVER_LIMIT,
    ]

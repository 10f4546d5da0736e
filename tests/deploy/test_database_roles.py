"""The application's database role cannot rewrite history (PostgreSQL).

The site's tables belong to the owner role that ran migrate; gunicorn logs in as the application
role that `db_roles` granted. These tests connect as that role, as someone holding the web
processes' credentials would, and try what a polite client never does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import errors

from tests.deploy.conftest import App, Site


@dataclass(frozen=True)
class History:
    order_id: str
    session_id: str


@pytest.fixture(scope="module")
def history(site_app: App) -> History:
    """A refund that executed and an over-refund that was refused, both through the API."""
    # A customer of its own in every test: what was auto-approved for one customer counts.
    order_id = site_app.site.database.order_create(total_cents=12_000, customer_id="CUS-901")
    client = site_app.client()
    executed = client.refund(1000, order_id=order_id, session="roles-1", customer="CUS-901")
    refused = client.refund(20_000, order_id=order_id, session="roles-1", customer="CUS-901")
    assert (executed["ok"], refused["code"]) == (True, "AMOUNT_EXCEEDS_REFUNDABLE")
    return History(order_id=order_id, session_id="roles-1")


@dataclass(frozen=True)
class Decided:
    """Three held refunds decided as the application role: one executed, one rejected, one
    approved and waiting for a worker; and the policy versions of an agent changed meanwhile."""

    executed: str
    rejected: str
    approved: str
    policy_versions: list[int]


# What the reviewers' pages and the worker do, run as the application role on the production
# settings: approve and execute, reject, approve; and a policy changed through its service.
_DECIDE = """
import json
from django.contrib.auth.models import User
from approvals.services import confirmation_approve, confirmation_execute, confirmation_reject
from dispatch.models import Agent
from dispatch.services import agent_create, policy_create

executed, rejected, approved = {ids!r}
ana = User.objects.create_user("roles-ana")
confirmation_approve(confirmation_id=executed, reviewer=ana)
confirmation_execute(confirmation_id=executed)
confirmation_reject(confirmation_id=rejected, reviewer=ana, reason="Not this one.")
confirmation_approve(confirmation_id=approved, reviewer=ana)
agent, _ = agent_create(name="roles-agent", allowed_tools=["get_order"], max_amount_cents=1000)
policy_create(agent=agent, allowed_tools=["get_order", "refund_order"], max_amount_cents=2000,
    created_by=ana)
print(json.dumps(sorted(agent.policies.values_list("version", flat=True))))
"""


@pytest.fixture(scope="module")
def decided(site_app: App) -> Decided:
    database = site_app.site.database
    order_id = database.order_create(total_cents=50_000, customer_id="CUS-904")
    client = site_app.client()
    held = [
        client.refund(amount, order_id=order_id, session=f"roles-held-{n}", customer="CUS-904")
        for n, amount in enumerate((6_000, 6_100, 6_200))
    ]
    assert [answer["code"] for answer in held] == ["CONFIRMATION_REQUIRED"] * 3
    ids = [answer["data"]["confirmation_id"] for answer in held]

    output = site_app.site.production.manage(
        "shell", "-c", _DECIDE.format(ids=ids), role=database.app
    )

    assert database.ledger(order_id) == (1, 6_000, 6_000)
    executed, rejected, approved = ids
    return Decided(executed, rejected, approved, json.loads(output.strip().splitlines()[-1]))


def _as_app(site: Site, statement: str) -> None:
    with site.database.connect(site.database.app) as connection:
        connection.execute(statement)


def _kept(site: Site) -> tuple[object, ...]:
    """What the refused statements would change, read as the owner."""
    with site.database.connect(site.database.owner) as connection:
        return tuple(
            connection.execute(query).fetchall()
            for query in (
                "SELECT id, status, amount_cents, customer_id FROM dispatch_confirmation "
                "ORDER BY id",
                "SELECT key, approval, amount_cents, released_at, at FROM dispatch_movement "
                "ORDER BY key",
                "SELECT id, version, max_amount_cents, allowed_tools::text FROM dispatch_policy "
                "ORDER BY id",
                "SELECT id, confirmation_id, reviewer_id, at FROM approvals_vote ORDER BY id",
                "SELECT id, kind, message FROM approvals_confirmationevent ORDER BY id",
                "SELECT count(*) FROM dispatch_securityevent",
            )
        )


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE dispatch_auditrecord SET ok = true, code = 'OK'",
        "DELETE FROM dispatch_auditrecord",
        "TRUNCATE dispatch_auditrecord",
        "UPDATE orders_refund SET amount_cents = 1",
        "DELETE FROM orders_refund",
        "TRUNCATE orders_refund",
        "TRUNCATE orders_order CASCADE",
        "ALTER TABLE orders_refund DISABLE TRIGGER ALL",
        "ALTER TABLE dispatch_auditrecord DISABLE TRIGGER dispatch_auditrecord_append_only",
        "ALTER TABLE orders_order DISABLE TRIGGER orders_order_refunded_cents_matches_ledger",
        "DROP TRIGGER orders_refund_append_only ON orders_refund",
        "ALTER TABLE orders_refund OWNER TO CURRENT_USER",
        "SET session_replication_role = replica",
        "CREATE TABLE orders_refund_copy (id bigint)",
        "CREATE TEMPORARY TABLE orders_refund (id bigint)",
        # A policy changes by a new version; votes and a confirmation's events stay.
        "UPDATE dispatch_policy SET max_amount_cents = 99999999",
        "DELETE FROM dispatch_policy",
        "UPDATE approvals_vote SET at = now()",
        "DELETE FROM approvals_vote",
        "UPDATE approvals_confirmationevent SET message = 'nothing happened'",
        "DELETE FROM approvals_confirmationevent",
        # A confirmation moves only forward, and what it is never changes.
        "UPDATE dispatch_confirmation SET status = 'pending' WHERE status = 'executed'",
        "UPDATE dispatch_confirmation SET status = 'pending' WHERE status = 'approved'",
        "UPDATE dispatch_confirmation SET status = 'approved' WHERE status = 'rejected'",
        "UPDATE dispatch_confirmation SET amount_cents = 1",
        "UPDATE dispatch_confirmation SET customer_id = 'CUS-1'",
        "DELETE FROM dispatch_confirmation",
        # Reserved money moves only as its protocol says.
        "UPDATE dispatch_movement SET amount_cents = 1",
        "UPDATE dispatch_movement SET released_at = now() WHERE approval = 'reviewer'",
        "UPDATE dispatch_movement SET at = at - interval '30 days'",
        "DELETE FROM dispatch_movement",
        # Security events go only through the bounded prune.
        "DELETE FROM dispatch_securityevent",
        "SELECT toolgate_prune_security_events(0, 1000, 1)",
        "SELECT toolgate_prune_security_events(30, 0, 1)",
        "CREATE FUNCTION toolgate_prune_security_events(integer) RETURNS int "
        "LANGUAGE sql AS 'SELECT 0'",
    ],
)
def test_the_application_role_is_refused(
    site_app: App, history: History, decided: Decided, statement: str
) -> None:
    site = site_app.site
    before = (
        site.database.ledger(history.order_id),
        site.database.audit_codes("roles-1"),
        _kept(site),
    )

    with pytest.raises((errors.InsufficientPrivilege, errors.InvalidParameterValue)):
        _as_app(site, statement)

    after = (
        site.database.ledger(history.order_id),
        site.database.audit_codes("roles-1"),
        _kept(site),
    )
    assert after == before
    assert before[:2] == ((1, 1000, 1000), ["OK", "AMOUNT_EXCEEDS_REFUNDABLE"])


def test_each_refused_change_has_rows_to_change(site_app: App, decided: Decided) -> None:
    """The refusals above refuse something: every state they would rewrite is there."""
    with site_app.site.database.connect(site_app.site.database.owner) as connection:
        statuses = dict(connection.execute("SELECT id, status FROM dispatch_confirmation"))
        approvals = {
            approval for (approval,) in connection.execute("SELECT approval FROM dispatch_movement")
        }
        counts = connection.execute(
            "SELECT (SELECT count(*) FROM approvals_vote), "
            "(SELECT count(*) FROM approvals_confirmationevent)"
        ).fetchone()
    assert counts is not None
    votes, events = counts

    assert [statuses[decided.executed], statuses[decided.rejected], statuses[decided.approved]] == [
        "executed",
        "rejected",
        "approved",
    ]
    assert {"policy", "reviewer", "approved"} <= approvals
    assert votes >= 2 and events >= 5


def test_the_application_role_cannot_commit_refunded_cents_without_a_ledger_row(
    site_app: App, history: History
) -> None:
    site = site_app.site

    with pytest.raises(errors.CheckViolation, match="ledger rows add up to 1000"):
        _as_app(
            site,
            "UPDATE orders_order SET refunded_cents = refunded_cents + 500 "
            f"WHERE order_id = '{history.order_id}'",
        )

    assert site.database.ledger(history.order_id) == (1, 1000, 1000)


def test_a_refund_through_the_api_runs_as_the_application_role(site_app: App) -> None:
    database = site_app.site.database
    order_id = database.order_create(total_cents=12_000, customer_id="CUS-902")

    result = site_app.client().refund(
        2590, order_id=order_id, session="roles-2", customer="CUS-902"
    )

    assert (result["ok"], result["code"]) == (True, "OK")
    assert database.ledger(order_id) == (1, 2590, 2590)
    assert database.audit_codes("roles-2") == ["OK"]
    with database.connect(database.owner) as connection:
        users = connection.execute(
            "SELECT DISTINCT usename FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert users == [(database.app,)]


def test_a_refused_over_refund_leaves_its_audit_record_as_the_application_role(
    site_app: App,
) -> None:
    database = site_app.site.database
    order_id = database.order_create(total_cents=4_000, customer_id="CUS-903")

    result = site_app.client().refund(
        4_001, order_id=order_id, session="roles-3", customer="CUS-903"
    )

    assert (result["ok"], result["code"]) == (False, "AMOUNT_EXCEEDS_REFUNDABLE")
    assert database.audit_codes("roles-3") == ["AMOUNT_EXCEEDS_REFUNDABLE"]
    assert database.ledger(order_id) == (0, 0, 0)


def test_a_table_a_later_migration_creates_is_usable_by_the_application_role(site: Site) -> None:
    database = site.database
    with database.connect(database.owner) as owner:
        owner.execute(
            "CREATE TABLE deploy_probe (id bigint GENERATED BY DEFAULT AS IDENTITY, n int)"
        )
    try:
        with database.connect(database.app) as app:
            app.execute("INSERT INTO deploy_probe (n) VALUES (1)")
            app.execute("UPDATE deploy_probe SET n = 2")
            rows = app.execute("SELECT n FROM deploy_probe").fetchall()
            app.execute("DELETE FROM deploy_probe")

            with pytest.raises(errors.InsufficientPrivilege):
                app.execute("TRUNCATE deploy_probe")

        assert rows == [(2,)]
    finally:
        with database.connect(database.owner) as owner:
            owner.execute("DROP TABLE deploy_probe")


def test_db_roles_takes_back_a_privilege_granted_by_hand(site: Site) -> None:
    database, production = site.database, site.production
    with database.connect(database.owner) as owner:
        owner.execute(f'GRANT TRUNCATE, UPDATE ON orders_refund TO "{database.app}"')
    with pytest.raises(RuntimeError, match="it has TRUNCATE on orders_refund"):
        production.manage("db_roles", "--app-role", database.app, "--check")

    production.manage("db_roles", "--app-role", database.app)

    production.manage("db_roles", "--app-role", database.app, "--check")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as_app(site, "UPDATE orders_refund SET amount_cents = 1")


def test_held_refunds_are_decided_and_executed_as_the_application_role(
    site_app: App, decided: Decided
) -> None:
    with site_app.site.database.connect(site_app.site.database.owner) as connection:
        events = connection.execute(
            "SELECT c.id, e.kind FROM approvals_confirmationevent e "
            "JOIN dispatch_confirmation c ON c.id = e.confirmation_id ORDER BY e.id"
        ).fetchall()
        money = dict(
            connection.execute(
                "SELECT confirmation_id, approval || CASE WHEN released_at IS NULL THEN '' "
                "ELSE ', released' END FROM dispatch_movement WHERE confirmation_id <> ''"
            ).fetchall()
        )

    held = (decided.executed, decided.rejected, decided.approved)
    kinds = {c: [kind for of, kind in events if of == c] for c in held}
    assert kinds[decided.executed] == ["voted", "approved", "executing", "executed"]
    assert kinds[decided.rejected] == ["rejected"]
    assert kinds[decided.approved] == ["voted", "approved"]
    assert money == {
        decided.executed: "reviewer",
        decided.rejected: "held, released",
        decided.approved: "approved",
    }


def test_a_policy_changes_by_a_new_version_as_the_application_role(decided: Decided) -> None:
    assert decided.policy_versions == [1, 2]


def test_security_events_are_pruned_through_the_bounded_function_as_the_application_role(
    site: Site,
) -> None:
    database = site.database
    with database.connect(database.owner) as owner:
        owner.execute(
            "INSERT INTO dispatch_securityevent (at, channel, method, path, status, reason, "
            "detail) SELECT now() - interval '40 days', 'api', 'POST', '/old', 401, 'x', '' "
            "FROM generate_series(1, 3)"
        )
        owner.execute(
            "INSERT INTO dispatch_securityevent (at, channel, method, path, status, reason, "
            "detail) VALUES (now(), 'api', 'POST', '/recent', 401, 'x', '')"
        )

    output = site.production.manage("prune_security_events", role=database.app)

    with database.connect(database.owner) as owner:
        paths = owner.execute("SELECT DISTINCT path FROM dispatch_securityevent").fetchall()
    assert "Deleted 3 security event(s)" in output
    assert ("/old",) not in paths and ("/recent",) in paths

"""`db_roles` without a PostgreSQL server: what it protects, and where it refuses to run.

What the application role can and cannot do on PostgreSQL is in tests/deploy/test_database_roles.py.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError
from django.db import connection

from dispatch.management.commands.db_roles import append_only_tables
from tests.conftest import Run


def test_the_append_only_tables_are_the_records_the_ledger_the_logs_votes_and_policies() -> None:
    assert append_only_tables() == [
        "approvals_confirmationevent",
        "approvals_policyevent",
        "approvals_vote",
        "dispatch_auditrecord",
        "dispatch_auditseal",
        "dispatch_policy",
        "dispatch_securityevent",
        "orders_refund",
        "retail_operation",
        "retail_payment",
    ]


@pytest.mark.skipif(connection.vendor == "postgresql", reason="about the other databases")
@pytest.mark.django_db
def test_it_refuses_to_run_on_a_database_other_than_postgresql(run: Run) -> None:
    with pytest.raises(CommandError, match="db_roles is for PostgreSQL"):
        run("db_roles", "--app-role", "toolgate_app")

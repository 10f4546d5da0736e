"""The head of a session's audit chain is its last record, no longer a copy on the session's row.

A unique index on (agent, session, place in the chain) lets only one record take each place and
finds the head backwards; it replaces the (agent, session, time) index, which it serves as well.
On PostgreSQL the index is built CONCURRENTLY (agents keep recording while a long trail is
indexed) and then made the constraint; on SQLite it is a unique index, since a constraint there
would rebuild the table with the PostgreSQL-only trigram index of migration 0021.
"""

from typing import Any

from django.db import migrations, models

_COLUMNS = "(agent_id, session_id, chain_seq)"


def _forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS audit_chain_place "
            f"ON dispatch_auditrecord {_COLUMNS}"
        )
        schema_editor.execute(
            "ALTER TABLE dispatch_auditrecord "
            "ADD CONSTRAINT audit_chain_place UNIQUE USING INDEX audit_chain_place"
        )
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS audit_session_idx")
    else:
        schema_editor.execute(
            f"CREATE UNIQUE INDEX audit_chain_place ON dispatch_auditrecord {_COLUMNS}"
        )
        schema_editor.execute("DROP INDEX IF EXISTS audit_session_idx")


def _backwards(apps: Any, schema_editor: Any) -> None:
    index = "CREATE INDEX audit_session_idx ON dispatch_auditrecord (agent_id, session_id, at)"
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(index.replace("INDEX", "INDEX CONCURRENTLY", 1))
        schema_editor.execute(
            "ALTER TABLE dispatch_auditrecord DROP CONSTRAINT IF EXISTS audit_chain_place"
        )
    else:
        schema_editor.execute(index)
        schema_editor.execute("DROP INDEX IF EXISTS audit_chain_place")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = False

    dependencies = [
        ("dispatch", "0021_audit_customer_and_arguments_search"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="auditrecord", name="audit_session_idx"),
                migrations.AddConstraint(
                    model_name="auditrecord",
                    constraint=models.UniqueConstraint(
                        fields=("agent", "session_id", "chain_seq"), name="audit_chain_place"
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(_forwards, _backwards, elidable=False)],
        ),
        migrations.RemoveField(model_name="session", name="audit_head"),
        migrations.RemoveField(model_name="session", name="audit_seq"),
    ]

"""An index on the idempotency records' session: the retention deletes a session's records with it.

On PostgreSQL it is built CONCURRENTLY, so that calls keep claiming keys while a large table is
indexed.
"""

from typing import Any

from django.db import migrations, models

_INDEX = "idempotency_session_idx"
_CREATE = (
    f"CREATE INDEX {{}} IF NOT EXISTS {_INDEX} ON dispatch_idempotencyrecord (agent_id, session_id)"
)


def _forwards(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(_CREATE.format(concurrently))


def _backwards(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently} IF EXISTS {_INDEX}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = False

    dependencies = [
        ("dispatch", "0022_audit_head_in_its_chain"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="idempotencyrecord",
                    index=models.Index(
                        fields=["agent", "session_id"], name="idempotency_session_idx"
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(_forwards, _backwards, elidable=False)],
        ),
    ]

"""Indexes for the calls page: a customer's calls, and the search in the raw arguments.

On PostgreSQL both are built CONCURRENTLY, so that agents keep writing audit records while a long
trail is indexed, and the search's index is a trigram GIN index (pg_trgm, a trusted extension
that the owner role running migrations may create). Elsewhere (SQLite) the customer's index is a
plain one and the search reads the table.
"""

from typing import Any

import django.contrib.postgres.indexes
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently, TrigramExtension
from django.db import migrations, models


class AddIndexOnline(AddIndexConcurrently):
    """CONCURRENTLY on PostgreSQL; a plain index elsewhere, or none for PostgreSQL's own kinds."""

    def __init__(self, *args: Any, postgresql_only: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.postgresql_only = postgresql_only

    def deconstruct(self) -> Any:
        name, args, kwargs = super().deconstruct()
        if self.postgresql_only:
            kwargs["postgresql_only"] = True
        return name, args, kwargs

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        elif not self.postgresql_only:
            migrations.AddIndex.database_forwards(
                self, app_label, schema_editor, from_state, to_state
            )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        elif not self.postgresql_only:
            migrations.AddIndex.database_backwards(
                self, app_label, schema_editor, from_state, to_state
            )


class TrigramExtensionKept(TrigramExtension):
    """CREATE EXTENSION IF NOT EXISTS pg_trgm on PostgreSQL; going back leaves it (other objects
    may use it), and does nothing elsewhere."""

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        return None


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = False

    dependencies = [
        ("dispatch", "0020_audit_chains"),
    ]

    operations = [
        TrigramExtensionKept(),
        AddIndexOnline(
            model_name="auditrecord",
            index=models.Index(fields=["customer_id", "at"], name="audit_customer_idx"),
        ),
        AddIndexOnline(
            model_name="auditrecord",
            index=django.contrib.postgres.indexes.GinIndex(
                django.contrib.postgres.indexes.OpClass(
                    django.db.models.functions.text.Upper("raw_arguments"), name="gin_trgm_ops"
                ),
                name="audit_raw_arguments_trgm",
            ),
            postgresql_only=True,
        ),
    ]

"""The database's own guards on PostgreSQL, rendered from the declarations they enforce.

What the application's role (docs/deploy.md) may do is set in two places. Grants (`db_roles`)
say which statements it may run on a table at all: policies, votes, confirmation events, audit
records, the refund ledger and security events it only inserts and reads. Where a statement is
needed but not every row or column it could touch, a trigger here refuses the rest, whoever asks:

- a confirmation's status moves only along CONFIRMATION_LIFECYCLE, its CONFIRMATION_FROZEN columns
  never change, and its expiry only comes sooner (dispatch.models);
- a reservation of money moves only as its protocol says (dispatch/store/allowance.py);
- security events are deleted only by `toolgate_prune_security_events`, which runs as the tables'
  owner and deletes only what is due, in bounded batches (dispatch.security);
- what a domain's money checks read changes only as its AppConfig's `money_guards` say
  (dispatch.pipeline.tools: SumOfLedger, FixedOnceInLedger, ChangedWithOperation): rendered by
  `money_guards_sql`, installed by a migration that calls `money_guards_install` and records
  `money_guards_fingerprint()` as its MONEY_GUARDS_FINGERPRINT.

Each is installed by a migration that calls `guards_install`. Rendered from the declarations
rather than copied into the migration, so that they cannot drift apart: a change to a
declaration needs a migration that calls `guards_install` again and records the new
`guards_fingerprint()` as its GUARDS_FINGERPRINT; tests/dispatch/store/test_guards.py fails
until there is one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.db.models import Field, ForeignKey, Model

from dispatch.models import (
    CONFIRMATION_FROZEN,
    CONFIRMATION_LIFECYCLE,
    Confirmation,
    SecurityEvent,
)
from dispatch.pipeline.tools import (
    ChangedWithOperation,
    FixedOnceInLedger,
    MoneyGuard,
    SumOfLedger,
)
from dispatch.store.allowance import MOVEMENT_PROTOCOL

CONFIRMATION_LIFECYCLE_FUNCTION = "dispatch_confirmation_lifecycle"
CONFIRMATION_LIFECYCLE_TRIGGER = "dispatch_confirmation_lifecycle"
MOVEMENT_PROTOCOL_FUNCTION = "dispatch_movement_protocol"
MOVEMENT_PROTOCOL_TRIGGER = "dispatch_movement_protocol"
PRUNE_FUNCTION = "toolgate_prune_security_events"

# The prune function refuses to keep less than this: events younger than the days, and the
# newest rows, stay whatever its caller asks. The settings may not go below either.
SECURITY_EVENTS_MIN_RETENTION_DAYS = 1
SECURITY_EVENTS_MIN_ROWS = 1000
# One batch of the prune function, and the most batches one call deletes.
SECURITY_EVENTS_PRUNE_BATCH = 1000
SECURITY_EVENTS_PRUNE_MAX_BATCHES = 100


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _columns(model: type[Model], names: tuple[str, ...]) -> list[str]:
    columns = []
    for name in names:
        field = model._meta.get_field(name)
        if not isinstance(field, Field) or not field.column:
            raise ValueError(f"{model.__name__}.{name} is not a column")
        columns.append(field.column)
    return columns


def confirmation_lifecycle_sql() -> str:
    """The lifecycle's function, from CONFIRMATION_LIFECYCLE and CONFIRMATION_FROZEN."""
    moves = ",\n            ".join(
        f"({_literal(before)}, {_literal(after)})"
        for before, following in sorted(CONFIRMATION_LIFECYCLE.items())
        for after in sorted(following)
    )
    frozen = "\n".join(
        f"    IF NEW.{column} IS DISTINCT FROM OLD.{column} THEN\n"
        f"        RAISE EXCEPTION 'a confirmation''s {column} never changes (%)', OLD.id\n"
        "            USING ERRCODE = 'insufficient_privilege';\n"
        "    END IF;"
        for column in _columns(Confirmation, CONFIRMATION_FROZEN)
    )
    return f"""
CREATE OR REPLACE FUNCTION {CONFIRMATION_LIFECYCLE_FUNCTION}() RETURNS trigger AS $$
BEGIN
{frozen}
    IF NEW.expires_at > OLD.expires_at THEN
        RAISE EXCEPTION 'a confirmation''s expiry only comes sooner (%)', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status AND (OLD.status, NEW.status) NOT IN (
            {moves}) THEN
        RAISE EXCEPTION 'a confirmation does not move from % to % (%)',
            OLD.status, NEW.status, OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""


def prune_function_sql(schema: str) -> str:
    """`toolgate_prune_security_events(keep_days, keep_rows, batches)`: deletes, oldest first and
    in batches, the events older than keep_days or beyond the newest keep_rows; returns how many.

    It runs as its owner (SECURITY DEFINER) with a fixed search_path, refuses to keep less than
    the floors, counts days by the database's clock and deletes at most
    SECURITY_EVENTS_PRUNE_MAX_BATCHES batches a call: whoever may call it can delete only what is
    due, never the newest rows nor the last day's."""
    table = SecurityEvent._meta.db_table
    schema = '"' + schema.replace('"', '""') + '"'
    return f"""
CREATE OR REPLACE FUNCTION {PRUNE_FUNCTION}(keep_days integer, keep_rows bigint, batches integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {schema}, pg_temp AS $$
DECLARE
    cutoff timestamptz;
    newest bigint;
    deleted bigint := 0;
    batch bigint;
BEGIN
    IF keep_days IS NULL OR keep_days < {SECURITY_EVENTS_MIN_RETENTION_DAYS} THEN
        RAISE EXCEPTION 'security events are kept at least % day(s), not %',
            {SECURITY_EVENTS_MIN_RETENTION_DAYS}, keep_days
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF keep_rows IS NULL OR keep_rows < {SECURITY_EVENTS_MIN_ROWS} THEN
        RAISE EXCEPTION 'at least the newest % security events are kept, not %',
            {SECURITY_EVENTS_MIN_ROWS}, keep_rows USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF batches IS NULL OR batches < 1 OR batches > {SECURITY_EVENTS_PRUNE_MAX_BATCHES} THEN
        RAISE EXCEPTION 'a prune deletes 1 to {SECURITY_EVENTS_PRUNE_MAX_BATCHES} batches, not %',
            batches USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := clock_timestamp() - make_interval(days => keep_days);
    SELECT max(id) INTO newest FROM {table};
    IF newest IS NULL THEN
        RETURN 0;
    END IF;
    FOR i IN 1..batches LOOP
        -- Ids only grow, so the rows past the cap are the ids up to the newest's minus the cap.
        DELETE FROM {table} WHERE id IN (
            SELECT id FROM {table} WHERE at < cutoff OR id <= newest - keep_rows
            ORDER BY id LIMIT {SECURITY_EVENTS_PRUNE_BATCH});
        GET DIAGNOSTICS batch = ROW_COUNT;
        deleted := deleted + batch;
        EXIT WHEN batch < {SECURITY_EVENTS_PRUNE_BATCH};
    END LOOP;
    RETURN deleted;
END;
$$;
REVOKE ALL ON FUNCTION {PRUNE_FUNCTION}(integer, bigint, integer) FROM PUBLIC;
"""


def guards_sql(schema: str) -> list[str]:
    """Every statement that installs the guards, in order (CREATE OR REPLACE: run again safely)."""
    confirmations = Confirmation._meta.db_table
    return [
        confirmation_lifecycle_sql(),
        f"DROP TRIGGER IF EXISTS {CONFIRMATION_LIFECYCLE_TRIGGER} ON {confirmations}",
        f"""CREATE TRIGGER {CONFIRMATION_LIFECYCLE_TRIGGER}
    BEFORE UPDATE ON {confirmations}
    FOR EACH ROW EXECUTE FUNCTION {CONFIRMATION_LIFECYCLE_FUNCTION}()""",
        MOVEMENT_PROTOCOL.format(function=MOVEMENT_PROTOCOL_FUNCTION),
        f"DROP TRIGGER IF EXISTS {MOVEMENT_PROTOCOL_TRIGGER} ON dispatch_movement",
        f"""CREATE TRIGGER {MOVEMENT_PROTOCOL_TRIGGER}
    BEFORE UPDATE OR DELETE ON dispatch_movement
    FOR EACH ROW EXECUTE FUNCTION {MOVEMENT_PROTOCOL_FUNCTION}()""",
        prune_function_sql(schema),
    ]


def guards_fingerprint() -> str:
    """What the guards render today, in short: the latest migration that installs them records
    it, so that a database migrated before a declaration changed is known to need them again."""
    return hashlib.sha256("\n".join(guards_sql("public")).encode()).hexdigest()[:16]


def guards_drop_sql() -> list[str]:
    return [
        f"DROP TRIGGER IF EXISTS {CONFIRMATION_LIFECYCLE_TRIGGER} ON {Confirmation._meta.db_table}",
        f"DROP FUNCTION IF EXISTS {CONFIRMATION_LIFECYCLE_FUNCTION}()",
        f"DROP TRIGGER IF EXISTS {MOVEMENT_PROTOCOL_TRIGGER} ON dispatch_movement",
        f"DROP FUNCTION IF EXISTS {MOVEMENT_PROTOCOL_FUNCTION}()",
        f"DROP FUNCTION IF EXISTS {PRUNE_FUNCTION}(integer, bigint, integer)",
    ]


def _install(schema_editor: Any, render: Callable[[str], list[str]]) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    for statement in render(schema):
        # No parameters: psycopg would read the `%` of RAISE EXCEPTION as a placeholder.
        schema_editor.execute(statement, params=None)


def guards_install(schema_editor: Any) -> None:
    """Install (or reinstall) the guards; nothing on a database other than PostgreSQL."""
    _install(schema_editor, guards_sql)


def guards_drop(schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in guards_drop_sql():
        schema_editor.execute(statement, params=None)


# What a domain's money checks read (each app's `money_guards`).


def money_guards() -> list[tuple[str, MoneyGuard]]:
    """Every app's declared money guards, with the app's label, in the apps' order."""
    return [
        (config.label, guard)
        for config in apps.get_app_configs()
        for guard in getattr(config, "money_guards", ())
    ]


def _model(label: str, name: str) -> type[Model]:
    return apps.get_model(label, name)


def _ledger(label: str, ledger: str, model: type[Model]) -> tuple[str, str]:
    """The ledger's table and the column of its foreign key to `model`."""
    name, _, key = ledger.partition(".")
    field = _model(label, name)._meta.get_field(key)
    if not isinstance(field, ForeignKey) or field.related_model is not model:
        raise ValueError(f"{ledger} is not a foreign key to {model.__name__}")
    return _model(label, name)._meta.db_table, field.column


def _trigger_function(function: str, schema: str, body: str) -> str:
    """A PL/pgSQL trigger function, its search_path pinned so that no schema or temporary table
    of the caller's can stand in for the tables it reads."""
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = {schema}, pg_temp
AS $$
{body}$$"""


def _distinct(columns: list[str]) -> str:
    """Whether an update changed any of the columns."""
    old = ", ".join(f"OLD.{column}" for column in columns)
    new = ", ".join(f"NEW.{column}" for column in columns)
    return f"ROW({new}) IS DISTINCT FROM ROW({old})"


def _sum_of_ledger_sql(label: str, guard: SumOfLedger, schema: str) -> list[str]:
    model = _model(label, guard.model)
    table, pk = model._meta.db_table, model._meta.pk.column
    (column,) = _columns(model, (guard.column,))
    ledger, key = _ledger(label, guard.ledger, model)
    (amount,) = _columns(_model(label, guard.ledger.partition(".")[0]), (guard.amount,))
    function = f"{label}_{column}_matches_ledger"
    return [
        _trigger_function(
            function,
            schema,
            f"""\
DECLARE
    row_pk bigint;
    kept numeric;
    entered numeric;
BEGIN
    IF TG_TABLE_NAME = {_literal(table)} THEN
        row_pk := NEW.{pk};
    ELSE
        row_pk := NEW.{key};
    END IF;
    -- The state at commit, not the row as this event saw it: an amount given back within the
    -- transaction left two events on the row, and both must judge its final value.
    SELECT t.{column} INTO kept FROM {table} t WHERE t.{pk} = row_pk;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(sum(l.{amount}), 0) INTO entered FROM {ledger} l WHERE l.{key} = row_pk;
    IF kept <> entered THEN
        RAISE EXCEPTION '{guard.model.lower()} % has {column} %, but its ledger rows add up to %',
            row_pk, kept, entered
            USING ERRCODE = 'check_violation',
                  HINT = '{column} changes only with a ledger row, in the same transaction';
    END IF;
    RETURN NULL;
END;
""",
        ),
        f"DROP TRIGGER IF EXISTS {table}_{column}_matches_ledger ON {table}",
        f"""CREATE CONSTRAINT TRIGGER {table}_{column}_matches_ledger
    AFTER INSERT OR UPDATE OF {column} ON {table}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {function}()""",
        f"DROP TRIGGER IF EXISTS {ledger}_{column}_matches_ledger ON {ledger}",
        f"""CREATE CONSTRAINT TRIGGER {ledger}_{column}_matches_ledger
    AFTER INSERT ON {ledger}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {function}()""",
    ]


def _fixed_once_in_ledger_sql(label: str, guard: FixedOnceInLedger, schema: str) -> list[str]:
    model = _model(label, guard.model)
    table, pk = model._meta.db_table, model._meta.pk.column
    columns = _columns(model, guard.columns)
    ledger, key = _ledger(label, guard.ledger, model)
    named = ", ".join(columns)
    function = f"{table}_fixed_once_in_ledger"
    return [
        _trigger_function(
            function,
            schema,
            f"""\
BEGIN
    IF {_distinct(columns)}
            AND EXISTS (SELECT 1 FROM {ledger} l WHERE l.{key} = OLD.{pk}) THEN
        RAISE EXCEPTION '{table} % has rows in {ledger}: its {named} no longer change', OLD.{pk}
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'they change only before the first row of {ledger} refers to it';
    END IF;
    RETURN NEW;
END;
""",
        ),
        f"DROP TRIGGER IF EXISTS {function} ON {table}",
        f"""CREATE TRIGGER {function}
    BEFORE UPDATE OF {named} ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}()""",
    ]


def _operation(label: str, operation: str) -> tuple[str, str]:
    name, _, column = operation.partition(".")
    (recorded_by,) = _columns(_model(label, name), (column,))
    return _model(label, name)._meta.db_table, recorded_by


def _operation_sql(label: str, operation: str, schema: str) -> list[str]:
    """The operation's rows carry the transaction that recorded them, whatever the insert says."""
    table, column = _operation(label, operation)
    function = f"{table}_{column}"
    return [
        _trigger_function(
            function,
            schema,
            f"""\
BEGIN
    -- The top-level transaction's id, the same within its savepoints.
    NEW.{column} := txid_current();
    RETURN NEW;
END;
""",
        ),
        f"DROP TRIGGER IF EXISTS {function} ON {table}",
        f"""CREATE TRIGGER {function}
    BEFORE INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}()""",
    ]


def _changed_with_operation_sql(label: str, guard: ChangedWithOperation, schema: str) -> list[str]:
    model = _model(label, guard.model)
    table = model._meta.db_table
    operation, column = _operation(label, guard.operation)
    function = f"{table}_changed_with_operation"
    if guard.columns:
        columns = _columns(model, guard.columns)
        of, changed = " OF " + ", ".join(columns), _distinct(columns)
    else:
        of, changed = "", "OLD.* IS DISTINCT FROM NEW.*"
    what = "its rows" + ("" if not guard.columns else f" and {', '.join(guard.columns)}")
    return [
        _trigger_function(
            function,
            schema,
            f"""\
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {operation} o WHERE o.{column} = txid_current()) THEN
        RAISE EXCEPTION '{table}: % without a row of {operation} in the same transaction', TG_OP
            USING ERRCODE = 'check_violation',
                  HINT = '{what} change only with the operation that records it';
    END IF;
    RETURN NULL;
END;
""",
        ),
        f"DROP TRIGGER IF EXISTS {table}_rows_with_operation ON {table}",
        f"""CREATE CONSTRAINT TRIGGER {table}_rows_with_operation
    AFTER INSERT OR DELETE ON {table}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {function}()""",
        f"DROP TRIGGER IF EXISTS {table}_changed_with_operation ON {table}",
        f"""CREATE CONSTRAINT TRIGGER {table}_changed_with_operation
    AFTER UPDATE{of} ON {table}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION {function}()""",
    ]


def money_guards_sql(schema: str) -> list[str]:
    """Every statement that installs the money guards, in order (run again safely)."""
    space = '"' + schema.replace('"', '""') + '"'
    statements: list[str] = []
    operations: list[tuple[str, str]] = []
    for label, guard in money_guards():
        if isinstance(guard, SumOfLedger):
            statements += _sum_of_ledger_sql(label, guard, space)
        elif isinstance(guard, FixedOnceInLedger):
            statements += _fixed_once_in_ledger_sql(label, guard, space)
        else:
            if (label, guard.operation) not in operations:
                operations.append((label, guard.operation))
                statements += _operation_sql(label, guard.operation, space)
            statements += _changed_with_operation_sql(label, guard, space)
    return statements


def money_guards_fingerprint() -> str:
    return hashlib.sha256("\n".join(money_guards_sql("public")).encode()).hexdigest()[:16]


def money_guards_install(schema_editor: Any) -> None:
    """Install (or reinstall) the money guards; nothing on a database other than PostgreSQL."""
    _install(schema_editor, money_guards_sql)

"""Grant the application's PostgreSQL role what it needs and nothing more, then check it.

Run as the role that owns the tables (the one `migrate` runs as), after every `migrate`. It can
be run again at any time: it sets the grants from scratch, in one transaction.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from psycopg import sql

from dispatch.store.guards import PRUNE_FUNCTION

# What the application does to ordinary tables. Never TRUNCATE, REFERENCES or TRIGGER, and no
# ownership: only the owner can alter a table or switch its triggers off.
TABLE_PRIVILEGES = sql.SQL("SELECT, INSERT, UPDATE, DELETE")
SEQUENCE_PRIVILEGES = sql.SQL("USAGE, SELECT")
# Rows that, once written, stay: the application inserts and reads them.
APPEND_ONLY_REVOKED = sql.SQL("UPDATE, DELETE")
# Rows that are never deleted; their updates are bounded by triggers (dispatch/store/guards.py).
KEPT_REVOKED = sql.SQL("DELETE")
# What the application runs as the tables' owner: the bounded prune of security events.
FUNCTIONS = (f"{PRUNE_FUNCTION}(integer, bigint, integer)",)


def _tables(declaration: str) -> list[str]:
    tables = []
    for config in apps.get_app_configs():
        for name in getattr(config, declaration, ()):
            tables.append(config.get_model(name)._meta.db_table)
    return sorted(tables)


def append_only_tables() -> list[str]:
    """The tables of the models each app names in its AppConfig's `append_only_models`."""
    return _tables("append_only_models")


def kept_tables() -> list[str]:
    """The tables of the models each app names in its AppConfig's `kept_models`."""
    return _tables("kept_models")


class Command(BaseCommand):
    help = (
        "Grant the application's database role least privileges on this database (PostgreSQL): "
        "no UPDATE or DELETE on the append-only tables, no DELETE on the kept ones, no "
        "TRUNCATE, no ownership, EXECUTE on the bounded prune function. Run it as "
        "the tables' owner after every migrate; it is safe to run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--app-role", required=True, help="the role the web processes and workers log in as"
        )
        parser.add_argument(
            "--owner-role",
            help="the role that owns the tables and runs migrate (default: the role connected)",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--sql", action="store_true", help="print the statements without running them"
        )
        mode.add_argument(
            "--check",
            action="store_true",
            help="change nothing; fail if the application role can do more than it should",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("db_roles is for PostgreSQL; this database is " + connection.vendor)
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user, current_schema()")
            current_user, schema = cursor.fetchone()
        app_role: str = options["app_role"]
        owner_role: str = options["owner_role"] or current_user
        if not options["sql"]:
            self._require_roles(app_role, owner_role)

        if not options["check"]:
            statements = self._statements(app_role=app_role, owner_role=owner_role, schema=schema)
            if options["sql"]:
                self.stdout.write("\n".join(f"{statement};" for statement in statements))
                return
            with transaction.atomic(), connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement, None)
            self.stdout.write(f"granted {app_role} least privileges ({len(statements)} statements)")

        problems = self._problems(app_role=app_role, owner_role=owner_role, schema=schema)
        if problems:
            raise CommandError(
                f"{app_role} is not as the application needs it:\n- " + "\n- ".join(problems)
            )
        self.stdout.write(
            f"{app_role}: no UPDATE, DELETE or TRUNCATE on {', '.join(append_only_tables())}; "
            f"no DELETE on {', '.join(kept_tables())}; owns nothing; cannot create in the schema"
        )

    def _require_roles(self, *roles: str) -> None:
        with connection.cursor() as cursor:
            for role in roles:
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                if cursor.fetchone() is None:
                    raise CommandError(f"role {role} does not exist (docs/deploy.md creates it)")

    def _statements(self, *, app_role: str, owner_role: str, schema: str) -> list[str]:
        app = sql.Identifier(app_role)
        owner = sql.Identifier(owner_role)
        space = sql.Identifier(schema)
        database = sql.Identifier(connection.settings_dict["NAME"])
        append_only = sql.SQL(", ").join(sql.Identifier(t) for t in append_only_tables())
        kept = sql.SQL(", ").join(sql.Identifier(t) for t in kept_tables())
        functions = sql.SQL(", ").join(sql.SQL(f) for f in FUNCTIONS)
        statements = [
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, app),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(space, app),
            # From scratch, so that a privilege granted by hand earlier does not survive.
            sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(space, app),
            sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA {} TO {}").format(
                TABLE_PRIVILEGES, space, app
            ),
            sql.SQL("REVOKE {} ON {} FROM {}").format(APPEND_ONLY_REVOKED, append_only, app),
            sql.SQL("REVOKE {} ON {} FROM {}").format(KEPT_REVOKED, kept, app),
            sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM {}").format(space, app),
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(functions, app),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(space, app),
            sql.SQL("GRANT {} ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
                SEQUENCE_PRIVILEGES, space, app
            ),
            # Tables that later migrations create (as the owner) are usable at once; a new
            # append-only table loses UPDATE and DELETE when this command runs after them.
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT {} ON TABLES TO {}"
            ).format(owner, space, TABLE_PRIVILEGES, app),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT {} ON SEQUENCES TO {}"
            ).format(owner, space, SEQUENCE_PRIVILEGES, app),
        ]
        raw = connection.connection
        return [statement.as_string(raw) for statement in statements]

    def _problems(self, *, app_role: str, owner_role: str, schema: str) -> list[str]:
        problems: list[str] = []
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT rolsuper, rolbypassrls, pg_has_role(%s, %s, 'MEMBER') FROM pg_roles "
                "WHERE rolname = %s",
                [app_role, owner_role, app_role],
            )
            superuser, bypass_rls, in_owner = cursor.fetchone()
            if superuser:
                problems.append("it is a superuser")
            if bypass_rls:
                problems.append("it bypasses row-level security")
            if in_owner:
                problems.append(f"it is {owner_role} or a member of it")
            cursor.execute(
                "SELECT has_schema_privilege(%s, %s, 'CREATE'), "
                "pg_has_role(%s, n.nspowner, 'MEMBER') FROM pg_namespace n WHERE n.nspname = %s",
                [app_role, schema, app_role, schema],
            )
            create, owns_schema = cursor.fetchone()
            if create:
                problems.append(f"it may create objects in schema {schema}")
            if owns_schema:
                problems.append(f"it owns schema {schema}")
            cursor.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'S') "
                "AND pg_has_role(%s, c.relowner, 'MEMBER') ORDER BY 1",
                [schema, app_role],
            )
            problems += [f"it owns {name}" for (name,) in cursor.fetchall()]
            cursor.execute(
                "SELECT c.relname, p.privilege FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "CROSS JOIN unnest(ARRAY['TRUNCATE', 'TRIGGER', 'REFERENCES']) AS p(privilege) "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') "
                "AND has_table_privilege(%s, c.oid, p.privilege) ORDER BY 1, 2",
                [schema, app_role],
            )
            problems += [f"it has {what} on {name}" for name, what in cursor.fetchall()]
            for table in append_only_tables():
                cursor.execute(
                    "SELECT p.privilege FROM unnest(ARRAY['UPDATE', 'DELETE']) AS p(privilege) "
                    "WHERE has_table_privilege(%s, %s::regclass, p.privilege)",
                    [app_role, connection.ops.quote_name(table)],
                )
                problems += [f"it has {what} on {table}" for (what,) in cursor.fetchall()]
            for table in kept_tables():
                cursor.execute(
                    "SELECT has_table_privilege(%s, %s::regclass, 'DELETE')",
                    [app_role, connection.ops.quote_name(table)],
                )
                if cursor.fetchone()[0]:
                    problems.append(f"it has DELETE on {table}")
            for function in FUNCTIONS:
                cursor.execute(
                    "SELECT p.prosecdef, pg_has_role(%s, p.proowner, 'MEMBER'), "
                    "has_function_privilege(%s, p.oid, 'EXECUTE') "
                    "FROM pg_proc p WHERE p.oid = to_regprocedure(%s)",
                    [app_role, app_role, function],
                )
                found = cursor.fetchone()
                if found is None:
                    problems.append(f"{function} is missing (run migrate)")
                    continue
                definer, owns, executes = found
                if not definer or owns:
                    problems.append(f"{function} does not run as the tables' owner")
                if not executes:
                    problems.append(f"it cannot run {function}, which prunes security events")
        return problems

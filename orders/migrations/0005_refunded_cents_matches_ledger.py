"""On PostgreSQL an order's refunded_cents must equal the sum of its ledger rows at every commit.

The application's role may update refunded_cents (the gateway's conditional update does), so a
privilege cannot tell a refund from a forged balance. These constraint triggers can: they run at
commit, after the whole transaction, and refuse it unless every order it touched adds up. A
refund that takes the amount and writes its ledger row commits; one that gives the amount back
when its key was taken commits; a bare UPDATE of refunded_cents, or a ledger row whose amount the
order did not take, does not. Only the tables' owner can drop or disable them.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION orders_refunded_cents_matches_ledger() RETURNS trigger
    LANGUAGE plpgsql
    -- Pinned, so that no schema or temporary table of the caller's can stand in for the ledger.
    SET search_path = {schema}, pg_temp
AS $$
DECLARE
    order_pk bigint;
    refunded bigint;
    entered numeric;
BEGIN
    IF TG_TABLE_NAME = 'orders_order' THEN
        order_pk := NEW.id;
    ELSE
        order_pk := NEW.order_id;
    END IF;
    -- The state at commit, not the row as this event saw it: a refund given back within the
    -- transaction left two events on the order, and both must judge its final value.
    SELECT o.refunded_cents INTO refunded FROM orders_order o WHERE o.id = order_pk;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(sum(r.amount_cents), 0) INTO entered
        FROM orders_refund r WHERE r.order_id = order_pk;
    IF refunded <> entered THEN
        RAISE EXCEPTION 'order % has refunded_cents %, but its ledger rows add up to %',
            order_pk, refunded, entered
            USING ERRCODE = 'check_violation',
                  HINT = 'refunded_cents changes only with a ledger row, in the same transaction';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER orders_order_refunded_cents_matches_ledger
    AFTER INSERT OR UPDATE OF refunded_cents ON orders_order
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION orders_refunded_cents_matches_ledger();

CREATE CONSTRAINT TRIGGER orders_refund_refunded_cents_matches_ledger
    AFTER INSERT ON orders_refund
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION orders_refunded_cents_matches_ledger();
"""

DROP = """
DROP TRIGGER IF EXISTS orders_refund_refunded_cents_matches_ledger ON orders_refund;
DROP TRIGGER IF EXISTS orders_order_refunded_cents_matches_ledger ON orders_order;
DROP FUNCTION IF EXISTS orders_refunded_cents_matches_ledger();
"""


def _create(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    # No parameters: psycopg would read the `%` of RAISE EXCEPTION as a placeholder.
    schema_editor.execute(CREATE.format(schema=connection.ops.quote_name(schema)), params=None)


def _drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("orders", "0004_refund_approval_as_data")]

    operations = [migrations.RunPython(_create, _drop)]

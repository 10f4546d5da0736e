"""What a policy change would have done: an agent's recorded money-moving calls, read once in time
order from the audit records and their confirmations, judged again by the pipeline's own what-if
(dispatch/pipeline/what_if.py) under a draft. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from time import monotonic
from typing import Any

from django.db import DatabaseError, connection, transaction

from analytics.heavy import RangeTooHeavy, statement_cancelled
from dispatch.models import AuditRecord, Confirmation, Movement
from dispatch.pipeline import codes
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.tools import MoneyFromArguments, MoneyFromState, ToolSpec
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    SETTLED,
    TWO_REVIEWERS,
    Confirmed,
    PastCall,
    WhatIf,
    replay_from,
    what_if_of,
)
from dispatch.registry import tool_registry

# The codes of the calls a what-if judges again, and the outcome each records.
RECORDED_OUTCOMES = {
    OK.name: AUTO_EXECUTED,
    CONFIRMATION_REQUIRED.name: ONE_REVIEWER,
    codes.POLICY_LIMIT.name: REFUSED,
}
# Rows a what-if reads from the database at a time: its memory holds no more than these and the
# money that counts at the moment it reached.
WHAT_IF_CHUNK = 2_000


def policy_what_if(
    *,
    agent_id: int,
    since: datetime,
    until: datetime,
    draft: Policy,
    deadline: float | None = None,
) -> WhatIf:
    """The agent's recorded money-moving calls in the range, judged again under `draft`, beside
    what really happened to them. Every agent's calls from before the range (as far back as the
    draft's sums reach) to its end are read once, in time order, in chunks; the others count in
    the sums by what happened to them (dispatch/pipeline/what_if.py). Reads only.

    `deadline` (time.monotonic()) bounds the whole replay: past it, RangeTooHeavy; so does a
    statement the database cancelled (a manager's request runs under a statement timeout)."""
    start = replay_from(draft, since)
    window = timedelta(seconds=draft.auto_approve_window_seconds)
    statements = (_held_before_sql(start, since, window), _money_calls_sql(start, until))
    try:
        # A server-side cursor streams only inside a transaction (outside one, PostgreSQL would
        # keep the whole result to hold it open).
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Every row is read: plan for all of them, not for the first few as a cursor
                # does (an index scan in time order took a quarter longer than a sort).
                with connection.cursor() as setting:
                    setting.execute("SELECT set_config('cursor_tuple_fraction', '1', true)")
            calls = _past_calls(
                _rows(statements), agent_id=agent_id, since=since, until=until, deadline=deadline
            )
            return what_if_of(draft, calls)
    except DatabaseError as error:
        if statement_cancelled(error):
            raise RangeTooHeavy(str(error).strip()) from error
        raise


def _rows(statements: Iterable[tuple[str, list[Any]]]) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of each statement in turn, in chunks: the held calls before the range's read-back
    start come before every call after it, so the calls stay in the order they arrived."""
    for statement, params in statements:
        with connection.chunked_cursor() as cursor:
            cursor.execute(statement, params)
            while rows := cursor.fetchmany(WHAT_IF_CHUNK):
                yield rows


def _money_calls_sql(start: datetime, until: datetime) -> tuple[str, list[Any]]:
    """Every agent's money-moving calls in [start, until), in the order they arrived, with what
    became of the held ones, in one statement; only the columns a replay needs (the arguments'
    subject, currency and amount, by what each tool declares, or its reserved money)."""
    columns, params = _columns()
    audit, held = _tables()
    reserved, joined = _reserved_join()
    params.append(CONFIRMATION_REQUIRED.name)
    params += joined
    params += [start, until, *RECORDED_OUTCOMES]
    filters, more = _money_filters()
    statement = f"""
        SELECT {columns}
        FROM {audit} a
        LEFT JOIN {held} c ON c.id = a.confirmation_id AND a.code = %s
        {reserved}
        WHERE a.at >= %s AND a.at < %s
            AND a.code IN ({", ".join(["%s"] * len(RECORDED_OUTCOMES))})
            AND {filters}
        ORDER BY a.at, a.id
    """
    return statement, params + more


def _held_before_sql(start: datetime, since: datetime, window: timedelta) -> tuple[str, list[Any]]:
    """The held calls made before `start` whose money may still count at `since` or later
    (dispatch.pipeline.what_if.held_money_reaches, in SQL): approved long before the range, a call
    executed within the window before it counts in the sums of the range. Found from their
    confirmations, each call by its session's index."""
    columns, params = _columns()
    audit, held = _tables()
    reserved, joined = _reserved_join()
    params.append(CONFIRMATION_REQUIRED.name)
    params += joined
    params += [start, since, since - window, *sorted(SETTLED)]
    filters, more = _money_filters()
    statement = f"""
        SELECT {columns}
        FROM {held} c
        JOIN {audit} a ON a.agent_id = c.agent_id AND a.session_id = c.session_id
            AND a.confirmation_id = c.id AND a.code = %s
        {reserved}
        WHERE a.at < %s
            AND (c.expires_at >= %s OR c.finished_at >= %s
                OR c.status NOT IN ({", ".join(["%s"] * len(SETTLED))}))
            AND {filters}
        ORDER BY a.at, a.id
    """
    return statement, params + more


def _tables() -> tuple[str, str]:
    return (
        connection.ops.quote_name(AuditRecord._meta.db_table),
        connection.ops.quote_name(Confirmation._meta.db_table),
    )


def _moving() -> list[ToolSpec[Any]]:
    return [spec for spec in tool_registry if spec.money is not None]


def _reserved_join() -> tuple[str, list[Any]]:
    """The money a call moved without a human, for the tools whose money comes from their
    subject's state (MoneyFromState) rather than their arguments: the reservation made under the
    call's key (a held call's is on its confirmation)."""
    by_state = [spec.name for spec in tool_registry if isinstance(spec.money, MoneyFromState)]
    if not by_state:
        return "", []
    movement = connection.ops.quote_name(Movement._meta.db_table)
    tools = ", ".join(["%s"] * len(by_state))
    return f"LEFT JOIN {movement} m ON m.key = a.key AND a.tool IN ({tools})", by_state


def _columns() -> tuple[str, list[Any]]:
    """What a replay reads of a call, with its parameters: its money's subject, currency and
    amount as each tool declares them, and its confirmation's fate."""
    params: list[Any] = []
    arguments = []
    for part in ("subject", "currency", "amount"):
        cases = []
        for spec in _moving():
            sql, more = _money_sql(spec, part)
            if sql:
                cases.append(f"WHEN %s THEN {sql}")
                params += [spec.name, *more]
        arguments.append(f"CASE a.tool {' '.join(cases)} END" if cases else "NULL")
    moments = ", ".join(_moment_sql(column) for column in _MOMENTS)
    columns = f"""a.call_id, a.agent_id, a.session_id, a.customer_id, a.tool, a.code,
            {", ".join(arguments)}, c.status, c.reviewers_required, {moments}"""
    return columns, params


def _money_sql(spec: ToolSpec[Any], part: str) -> tuple[str, list[Any]]:
    """Where a call of the tool keeps one part of its money, with its parameters; "" where it
    keeps none. The subject is always an argument; the currency and the amount are arguments or,
    for money from the subject's state, the confirmation's or the reservation's."""
    money = spec.money
    if part == "subject":
        field = spec.subject_field
    elif isinstance(money, MoneyFromArguments):
        field = money.amount if part == "amount" else money.currency
    else:
        return _RESERVED[part], []
    return ("", []) if field is None else (_argument_sql(), [_argument_path(field)])


# Where the money of a tool with MoneyFromState is read: its confirmation's if it was held, else
# its reservation's (_reserved_join).
_RESERVED = {
    "currency": "COALESCE(NULLIF(c.currency, ''), m.currency)",
    "amount": "CAST(COALESCE(c.amount_cents, m.amount_cents) AS TEXT)",
}


def _money_filters() -> tuple[str, list[Any]]:
    """The calls a replay reads: first answers (not replays) of tools that move money."""
    moving = [spec.name for spec in _moving()]
    return (
        "NOT a.replayed AND a.arguments IS NOT NULL"
        f" AND a.tool IN ({', '.join(['%s'] * len(moving)) or 'NULL'})",
        moving,
    )


# The moments a replay reads: the call's, and its confirmation's expiry, decision and end.
_MOMENTS = ("a.at", "c.expires_at", "c.decided_at", "c.finished_at")


def _moment_sql(column: str) -> str:
    # On PostgreSQL as seconds since the epoch: a float is read in C, where a timestamp is read
    # by Django's time zone loader in Python, which took a third of a 30-day what-if.
    if connection.vendor == "postgresql":
        return f"date_part('epoch', {column})"
    return column


def _argument_sql() -> str:
    # One argument of the validated call, as text (a number as its digits).
    if connection.vendor == "postgresql":
        return "a.arguments ->> %s"
    return "json_extract(a.arguments, %s)"


def _argument_path(field: str) -> str:
    return field if connection.vendor == "postgresql" else f'$."{field}"'


def _past_calls(
    chunks: Iterable[list[tuple[Any, ...]]],
    *,
    agent_id: int,
    since: datetime,
    until: datetime,
    deadline: float | None,
) -> Iterator[PastCall]:
    chosen = str(agent_id)
    moment = _from_epoch if connection.vendor == "postgresql" else _aware
    for rows in chunks:
        if deadline is not None and monotonic() > deadline:
            raise RangeTooHeavy(f"the replay had not reached {until.isoformat()} in time")
        for (
            call_id,
            agent,
            session_id,
            customer_id,
            tool,
            code,
            subject,
            currency,
            amount,
            status,
            reviewers,
            at,
            expires_at,
            decided_at,
            finished_at,
        ) in rows:
            if amount is None:
                continue
            at = moment(at)
            outcome = RECORDED_OUTCOMES[code]
            confirmation = None
            if status is not None:
                confirmation = Confirmed(
                    status,
                    moment(expires_at),
                    None if decided_at is None else moment(decided_at),
                    None if finished_at is None else moment(finished_at),
                    reviewers,
                )
                if outcome == ONE_REVIEWER and reviewers == 2:
                    outcome = TWO_REVIEWERS
            agent = str(agent)
            yield PastCall(
                at,
                agent,
                session_id,
                customer_id,
                tool,
                str(subject or ""),
                str(currency or ""),
                int(amount),
                outcome,
                call_id,
                agent == chosen and at >= since,
                confirmation,
            )


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _aware(value: Any) -> datetime:
    # SQLite returns naive datetimes in UTC, or text.
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

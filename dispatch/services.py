"""What the API, the commands and the admin call to change dispatch state."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.utils import timezone

from dispatch.models import Agent, CallChannel, IdempotencyRecord, Policy
from dispatch.pipeline.engine import Limits, PendingEffect, Pipeline, PreparedCall
from dispatch.pipeline.policy import CurrencyLimits, HumanRule
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.state import StoreUnavailable
from dispatch.pipeline.tools import ToolCall
from dispatch.registry import tool_registry
from dispatch.store import OrmState
from dispatch.store.backends import backend, ends_transaction

TOKEN_PREFIX = "tg_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class UnknownTools(ValueError):
    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        super().__init__(f"unknown tools: {', '.join(self.names)}")


@transaction.atomic
def policy_create(
    *,
    agent: Agent,
    allowed_tools: Iterable[str],
    currencies: Mapping[str, CurrencyLimits] | None = None,
    humans: Mapping[str, str] | None = None,
    max_amount_cents: int | None = None,
    auto_approve_below_cents: int = 0,
    auto_approve_window_seconds: int = 24 * 3600,
    daily_cap_cents: int | None = None,
    two_reviewers_from_cents: int | None = None,
    confirm_above_cents: int | None = None,
    factor_above_cents: int | None = None,
    step_budget: int = 50,
    repeat_limit: int = 3,
    confirmation_ttl_seconds: int = 24 * 3600,
    duplicate_lookback_seconds: int | None = None,
    created_by: User | None = None,
) -> Policy:
    """A new version of the agent's policy; earlier versions stay as they were.

    Its money thresholds are per currency (`currencies`, minor units). The flat thresholds are a
    shorthand for the same numbers in each of TOOLGATE_POLICY_CURRENCIES; a currency with no
    thresholds is held for a human."""
    tools = sorted(set(allowed_tools))
    unknown = [name for name in tools if tool_registry.get(name) is None]
    if unknown:
        raise UnknownTools(unknown)
    rules = {tool: HumanRule(rule).value for tool, rule in sorted((humans or {}).items())}
    unknown = [name for name in rules if tool_registry.get(name) is None]
    if unknown:
        raise UnknownTools(unknown)
    if currencies is None:
        if max_amount_cents is None:
            raise ValueError("a policy needs thresholds per currency, or a maximum amount")
        flat = CurrencyLimits(
            max_amount_cents,
            auto_approve_below_cents,
            two_reviewers_from_cents,
            daily_cap_cents,
            confirm_above_cents,
            factor_above_cents,
        )
        currencies = {currency: flat for currency in settings.TOOLGATE_POLICY_CURRENCIES}
    # Locking the agent makes concurrent edits take consecutive versions.
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    latest = locked.policies.order_by("-version").values_list("version", flat=True).first()
    policy = Policy.objects.create(
        agent=locked,
        version=(latest or 0) + 1,
        allowed_tools=tools,
        currency_limits={
            currency.upper(): limits._asdict() for currency, limits in sorted(currencies.items())
        },
        human_rules=rules,
        auto_approve_window_seconds=auto_approve_window_seconds,
        step_budget=step_budget,
        repeat_limit=repeat_limit,
        confirmation_ttl_seconds=confirmation_ttl_seconds,
        duplicate_lookback_seconds=duplicate_lookback_seconds,
        created_by=created_by,
    )
    locked.current_policy = policy
    locked.save(update_fields=["current_policy"])
    agent.current_policy = policy
    return policy


@transaction.atomic
def agent_create(*, name: str, token: str | None = None, **policy: Any) -> tuple[Agent, str]:
    """Create an agent with its first policy; returns the token, which is never stored.

    A token is drawn at random unless one is chosen (the demo's documented token).
    """
    token = token or TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent = Agent.objects.create(name=name, token_prefix=token[:10], token_hash=token_hash(token))
    policy_create(agent=agent, **policy)
    return agent, token


def agent_token_set(*, agent: Agent, token: str) -> None:
    """Give an agent a chosen token, and enable it; like every token it is stored as a hash."""
    agent.token_prefix = token[:10]
    agent.token_hash = token_hash(token)
    agent.is_active = True
    agent.save(update_fields=["token_prefix", "token_hash", "is_active"])


_CURRENT_POLICY = Agent._meta.get_field("current_policy")


def agent_authenticate(token: str) -> Agent | None:
    """The active agent that holds the token, with its current policy; None for no such agent.

    What `Agent.objects.select_related("current_policy").filter(token_hash=..., is_active=True)`
    reads, in one statement built once per database: every API request authenticates, and
    compiling that query on each one cost the web process more CPU than sending it.
    """
    lookup = _agent_by_token(connection.alias, connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(lookup.sql, [token_hash(token), True])
        row = cursor.fetchone()
    if row is None:
        return None
    values = [
        _converted(value, *converters)
        for value, converters in zip(row, lookup.converters, strict=True)
    ]
    split = len(lookup.agent_fields)
    agent = Agent.from_db(connection.alias, lookup.agent_fields, values[:split])
    policy = None
    if values[split] is not None:  # the policy's id: the join found one
        policy = Policy.from_db(connection.alias, lookup.policy_fields, values[split:])
    _CURRENT_POLICY.set_cached_value(agent, policy)
    return agent


class _TokenLookup(NamedTuple):
    sql: str
    agent_fields: list[str]
    policy_fields: list[str]
    # Per column, what the ORM applies to its value (the backend's, then the field's) and the
    # expression they are given.
    converters: list[tuple[list[Callable[[Any, Any, Any], Any]], Any]]


@cache
def _agent_by_token(alias: str, vendor: str) -> _TokenLookup:
    database = connections[alias]
    agent, policy = Agent._meta, Policy._meta

    quote = database.ops.quote_name

    def column(table: str, field: Any) -> str:
        return f"{table}.{quote(field.column)}"

    columns = [(field, "a") for field in agent.concrete_fields]
    columns += [(field, "p") for field in policy.concrete_fields]
    sql = (
        f"SELECT {', '.join(column(table, field) for field, table in columns)}"
        f" FROM {quote(agent.db_table)} a LEFT JOIN {quote(policy.db_table)} p"
        f" ON {column('p', policy.pk)} = {column('a', _CURRENT_POLICY)}"
        f" WHERE {column('a', agent.get_field('token_hash'))} = %s"
        f" AND {column('a', agent.get_field('is_active'))} = %s"
    )
    converters = []
    for field, _ in columns:
        expression = field.get_col(field.model._meta.db_table)
        of_backend = database.ops.get_db_converters(expression)
        converters.append((of_backend + expression.get_db_converters(database), expression))
    return _TokenLookup(
        sql,
        [field.attname for field in agent.concrete_fields],
        [field.attname for field in policy.concrete_fields],
        converters,
    )


def _converted(
    value: Any, converters: list[Callable[[Any, Any, Any], Any]], expression: Any
) -> Any:
    for convert in converters:
        value = convert(value, expression, connection)
    return value


@cache
def _pipeline() -> Pipeline:
    # No store of its own: each call runs on an OrmState of its own (call_dispatch).
    return Pipeline(
        tool_registry,
        limits=Limits(max_argument_bytes=settings.TOOLGATE_MAX_ARGUMENT_BYTES),
    )


def call_dispatch(
    *,
    agent: Agent,
    session_id: str,
    customer_id: str,
    tool: str,
    arguments: str | Mapping[str, Any],
    context: str = "",
    on_result: Callable[[CallResult], None] | None = None,
    channel: str = CallChannel.API,
    clock: Callable[[], datetime] | None = None,
) -> CallResult:
    """Run one raw tool call through the pipeline; raises SessionConflict for a foreign session.

    `channel` is how the call came in (the API, or the MCP server), which its audit record keeps.

    `on_result` is called with the result inside the call's transaction, before it commits: what
    must commit with the call's effect or not at all (the host's Idempotency-Key answer).
    `clock` gives the pipeline's time (when the call arrived), for a demo's history.
    """
    policy = agent.current_policy
    if policy is None:
        raise ValueError(f"agent {agent.name} has no policy")
    call = ToolCall(
        agent_id=str(agent.pk),
        session_id=session_id,
        customer_id=customer_id,
        tool=tool,
        arguments=arguments,
        context=context,
    )
    pipeline = _pipeline() if clock is None else _pipeline().on_clock(clock)
    prepared = pipeline.prepare(call, policy.snapshot())
    checked = prepared.checked
    if prepared.writes and not isinstance(checked, CallResult) and checked.spec.remote:
        return _remote_write(pipeline, prepared, channel=channel, on_result=on_result)
    # A call that writes is one transaction: its step, idempotency record, confirmation, ledger
    # row and audit record commit together or not at all, and an identical call waits on the
    # key's row lock, then replays the outcome. Any other call runs in the backend's read scope.
    scope = transaction.atomic() if prepared.writes else backend().read_scope()
    with scope, connection.cursor() as cursor:
        # The audit record is a write's last statement, unless the host's answer follows it.
        commits = prepared.writes and on_result is None and ends_transaction()
        state = OrmState(cursor, tool_registry, channel=channel, commits=commits)
        result = pipeline.run_prepared(prepared, state)
        if on_result is not None:
            on_result(result)
        return result


def _remote_write(
    pipeline: Pipeline,
    prepared: PreparedCall,
    *,
    channel: str,
    on_result: Callable[[CallResult], None] | None,
) -> CallResult:
    """A write whose effect an upstream makes over the network, in three steps, so that no lock
    is held across the network: the call's step, key (in progress) and reservation commit
    first; the upstream is called with no transaction open; the outcome, the key's status and
    the audit record commit last. A process that dies in between leaves the key in progress and
    the money counted, never an effect made twice (docs/upstreams.md)."""
    with transaction.atomic(), connection.cursor() as cursor:
        state = OrmState(cursor, tool_registry, channel=channel)
        opened = pipeline.open_prepared(prepared, state)
        if isinstance(opened, CallResult):
            if on_result is not None:
                on_result(opened)
            return opened
        _effect_lease(opened)
    execution = pipeline.effect_make(opened)
    for attempt in (1, 2):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                state = OrmState(cursor, tool_registry, channel=channel)
                result = pipeline.effect_end(opened, execution, state)
                if on_result is not None:
                    on_result(result)
                return result
        except StoreUnavailable as error:
            if attempt == 2 or not _a_deadlocks_victim(error):
                raise
            # PostgreSQL rolled this transaction back to break a deadlock (an identical call
            # recording its answer in the same session's chain): nothing of it committed, and
            # the connection is sound, so the outcome is settled once more.
    raise AssertionError("unreachable")


def _effect_lease(effect: PendingEffect) -> None:
    """A remote write's lease and call, committed with its key in progress: an identical call
    after the lease takes the key over, and settle_outcomes finds its effect by its arguments."""
    checked, call = effect.claimed.checked, effect.prepared.call
    IdempotencyRecord.objects.filter(pk=checked.key).update(
        lease_until=timezone.now() + timedelta(seconds=checked.spec.lease_seconds),
        remote_call={
            "arguments": dict(checked.validated),
            "customer_id": call.customer_id,
            "agent_id": call.agent_id,
        },
    )


def _a_deadlocks_victim(error: BaseException) -> bool:
    """Whether PostgreSQL rolled the transaction back to break a deadlock."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "sqlstate", None) == "40P01":
            return True
        seen = seen.__cause__
    return False

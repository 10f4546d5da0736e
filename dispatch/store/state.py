"""The core's state port on the database, for one call.

dispatch.services.call_dispatch makes one OrmState per call, on one cursor, inside the scope the
call needs: a write's transaction, or the backend's read scope. This module runs the statements;
which statements run, one by one or joined, is the backend's (dispatch/store/backends.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import psycopg
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils.dateparse import parse_datetime

from dispatch.audit_keys import audit_mac
from dispatch.models import AuditRecord, CallChannel, Confirmation, IdempotencyRecord
from dispatch.pipeline.allowance import AllowanceHistory, AllowanceRequest, HoldReason
from dispatch.pipeline.audit_chain import GENESIS, audit_chain, link_hash
from dispatch.pipeline.state import (
    AuditEntry,
    Claim,
    ClaimRequest,
    KeyStatus,
    Lookup,
    Opening,
    PendingConfirmation,
    ReadAhead,
    SessionConflict,
    Settlement,
    StoreUnavailable,
    Verdict,
    decide_claim,
)
from dispatch.pipeline.tools import LookupSource, ToolRegistry
from dispatch.store import sql
from dispatch.store.allowance import (
    RESERVE,
    Reservation,
    allowance_ahead,
    allowance_release,
    allowance_reserve,
)
from dispatch.store.backends import CLAIM_PARAMS, Row, backend, fetch_row, only

_JSON_FIELD = IdempotencyRecord._meta.get_field("result")
# Each failed try means another call of the session recorded in between: a few is plenty.
_LINK_TRIES = 50

# The database away: through Django, or on statements sent on the driver's connection itself
# (the allowance's, a write's last); and a transaction that an earlier such error broke, which
# can no longer record the call.
_AWAY = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    transaction.TransactionManagementError,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _raises_store_unavailable(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """The database away under the method is the core's StoreUnavailable: the call stops there,
    and its transaction, rolled back, keeps nothing of it."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except _AWAY as error:
            raise StoreUnavailable(str(error).strip()[:200]) from error

    return wrapper


class OrmState:
    def __init__(
        self,
        cursor: CursorWrapper,
        registry: ToolRegistry,
        *,
        channel: str = CallChannel.API,
        commits: bool = False,
    ) -> None:
        self.cursor = cursor
        self.registry = registry
        # The audit record is the last statement of the call's own transaction, which the store
        # may commit with it (dispatch.services.call_dispatch says when).
        self.commits = commits
        # How the call came in (the API or MCP): what its audit record says.
        self.channel = channel
        self.backend = backend()
        # The session's audit head as the call's opening read it: what its record links to.
        self._head: tuple[int, str] | None = None
        # The money the call reserved, written with its audit record (dispatch/store/allowance.py).
        self._reserved: Reservation | None = None
        # The allowance request the opening locked and read the history of, and what it read.
        self._history_read: tuple[AllowanceRequest | None, list[list[Any]]] | None = None

    @_raises_store_unavailable
    def open_call(
        self,
        *,
        agent_id: str,
        session_id: str,
        customer_id: str,
        step_budget: int,
        claim: ClaimRequest | None,
    ) -> Opening:
        params: dict[str, Any] = {
            "agent_id": int(agent_id),
            "session_id": session_id,
            "customer_id": customer_id,
        }
        if claim is None:
            row = self.backend.count_step(self.cursor, {**params, "now": _db_time(_now())})
            if row is None:
                raise SessionConflict(session_id)
            self._head = _head_of(row)
            return Opening(row["steps"], None)

        if claim.exclusive and not connection.in_atomic_block:
            # Its claim, effect and audit record must commit together (call_dispatch).
            raise RuntimeError("a write's key is claimed only inside its call's transaction")
        first_verdict, first_status = _first_decision(claim)
        params |= {
            "key": claim.key,
            "tool": claim.tool,
            "new_status": first_status.value,
            "count": 1,
            "now": _db_time(claim.now),
            "step_budget": step_budget,
        }
        if claim.watched is not None:
            params["watched"] = claim.watched
        source = self._source(claim.lookup)
        # The money the call would reserve: its lock and history, read with the opening.
        ahead = [] if claim.allowance is None else allowance_ahead(claim.allowance)
        row, read = self.backend.open_call(
            self.cursor,
            params,
            None if source is None or claim.lookup is None else (source, claim.lookup.key),
            ahead,
        )
        if ahead and read:
            self._history_read = (claim.allowance, read[1:])
        if row is None:
            raise SessionConflict(session_id)
        self._head = _head_of(row)
        # Nothing counted: a read of a held call's status while it waits (ClaimRequest.watched).
        free = row["counted"] == 0
        if row["steps"] > step_budget and not free:
            return Opening(row["steps"], None)
        read_ahead = None
        if source is not None and "lookup_found" in row:
            read_ahead = ReadAhead(source.to_value(row) if row["lookup_found"] else None)
        params["count"] = row["counted"]
        decided = self._decide(row, claim, params, first_verdict, first_status)
        return Opening(row["steps"], decided, read_ahead, free)

    @_raises_store_unavailable
    def claim(
        self,
        *,
        key: str,
        agent_id: str,
        session_id: str,
        tool: str,
        exclusive: bool,
        repeat_limit: int,
        now: datetime,
        count: bool = True,
    ) -> Claim:
        request = ClaimRequest(key, tool, exclusive, repeat_limit, now)
        first_verdict, first_status = _first_decision(request)
        params = {
            "key": key,
            "agent_id": int(agent_id),
            "session_id": session_id,
            "tool": tool,
            "new_status": first_status.value,
            "count": 1 if count else 0,
            "now": _db_time(now),
        }
        self.cursor.execute(sql.CLAIM, params)
        return self._decide(
            _one(fetch_row(self.cursor)), request, params, first_verdict, first_status
        )

    def _decide(
        self,
        row: Row,
        request: ClaimRequest,
        params: Mapping[str, Any],
        first_verdict: Verdict,
        first_status: KeyStatus,
    ) -> Claim:
        """Apply the decision table to a key's record as the claim returned it."""
        while True:
            status = KeyStatus(row["key_status"])
            attempts = row["key_attempts"]
            if params["count"] and attempts == 1 and status is first_status and row["key_fresh"]:
                # Inserted by this very statement (a known key would count 2 or more): already
                # in the status its decision gives it.
                return Claim(verdict=first_verdict, attempts=attempts, previous=KeyStatus.OPEN)
            expiry = _as_datetime(row["key_confirmation_expires_at"])
            verdict, new_status = decide_claim(
                status=status,
                attempts=attempts,
                repeat_limit=request.repeat_limit,
                exclusive=request.exclusive,
                # A held key's confirmation that was approved no longer expires (no expiry).
                confirmation_live=expiry is None or expiry > request.now,
            )
            if new_status is not status:
                self.cursor.execute(
                    sql.MOVE_KEY,
                    {"key": request.key, "status": status.value, "new_status": new_status.value},
                )
                if self.cursor.rowcount != 1:
                    # The twin moved it first: read the key again, without counting twice.
                    params = {**only(params, *CLAIM_PARAMS), "count": 0}
                    self.cursor.execute(sql.CLAIM, params)
                    row = _one(fetch_row(self.cursor))
                    continue
            if verdict is Verdict.IN_PROGRESS and self._taken_over(request.key):
                # Its effect may have been made: the call finishes it as an unknown one, reading
                # what happened before it sends again.
                return Claim(Verdict.OWNED, attempts, previous=KeyStatus.UNKNOWN)
            confirmation_id = row["key_confirmation_id"]
            held = verdict is Verdict.HELD and confirmation_id
            return Claim(
                verdict=verdict,
                attempts=attempts,
                previous=status,
                result=_as_json(row["key_result"]),
                confirmation=_pending(confirmation_id) if held else None,
            )

    def _taken_over(self, key: str) -> bool:
        """Whether this call took over a key in progress whose lease ran out."""
        self.cursor.execute(sql.TAKE_OVER, {"key": key, "now": _db_time(_now())})
        return bool(self.cursor.rowcount == 1)

    @_raises_store_unavailable
    def settle(self, settlement: Settlement) -> None:
        self.cursor.execute(sql.SETTLE, _settle_params(settlement))

    @_raises_store_unavailable
    def hold(self, confirmation: PendingConfirmation) -> None:
        with transaction.atomic():
            Confirmation.objects.create(
                id=confirmation.confirmation_id,
                key=confirmation.key,
                tool=confirmation.tool,
                arguments=dict(confirmation.arguments),
                arguments_hash=confirmation.arguments_hash,
                agent_id=int(confirmation.agent_id),
                session_id=confirmation.session_id,
                customer_id=confirmation.customer_id,
                policy_version=confirmation.policy_version,
                reviewers_required=confirmation.reviewers_required,
                amount_cents=confirmation.amount_cents,
                currency=confirmation.currency,
                hold_reason=dict(confirmation.reason) if confirmation.reason else None,
                host_context=confirmation.host_context,
                duplicate_of=confirmation.duplicate_of,
                created_at=confirmation.created_at,
                expires_at=confirmation.expires_at,
            )
            IdempotencyRecord.objects.filter(key=confirmation.key).update(
                status=KeyStatus.HELD.value,
                confirmation_id=confirmation.confirmation_id,
                confirmation_expires_at=confirmation.expires_at,
                updated_at=confirmation.created_at,
            )

    @_raises_store_unavailable
    def record(self, entry: AuditEntry, settlement: Settlement | None = None) -> None:
        audit = {
            "call_id": entry.call_id,
            "at": _db_time(entry.at),
            "agent_id": int(entry.agent_id),
            "session_id": entry.session_id,
            "customer_id": entry.customer_id,
            "step": entry.step,
            "tool": _storable(entry.tool[: AuditRecord._meta.get_field("tool").max_length]),
            "raw_arguments": _storable(entry.raw_arguments),
            "arguments": _db_json(dict(entry.arguments) if entry.arguments is not None else None),
            "key": entry.key or "",
            "ok": entry.ok,
            "code": entry.code,
            "message": _storable(entry.message),
            "replayed": entry.replayed,
            "confirmation_id": entry.confirmation_id or "",
            "policy_version": entry.policy_version,
            "duration_ms": entry.duration_ms,
            "channel": self.channel,
        }
        settle = None if settlement is None else _settle_params(settlement)
        reserve, self._reserved = self._reserved, None
        commit = self.commits
        chain = audit_chain(audit["agent_id"], audit["session_id"])
        fields = {**audit, "at": entry.at, "arguments": entry.arguments}
        head = self._head
        for _ in range(_LINK_TRIES):
            if head is None:
                head = self._read_head(audit["agent_id"], audit["session_id"])
            seq, previous = head[0] + 1, head[1]
            chain_hash = link_hash(chain=chain, seq=seq, previous=previous, fields=fields)
            linked = {
                **audit,
                "chain_seq": seq,
                "chain_hash": chain_hash,
                "chain_mac": audit_mac(chain_hash),
            }
            if self.backend.end_call(self.cursor, settle, linked, reserve, commit=commit):
                self._head = (seq, linked["chain_hash"])
                return
            if not commit:
                # The key and the money were written all the same: only the record is linked
                # again. (A statement sent with its commit was undone whole.)
                settle = reserve = None
            # Linked again, it commits with the scope.
            commit = False
            head = None
        raise RuntimeError(f"the audit chain of session {entry.session_id} would not settle")

    def _read_head(self, agent_id: int, session_id: str) -> tuple[int, str]:
        """The session's audit head, read when the opening did not return it (a call that failed
        before it) or another record took the place after it."""
        self.cursor.execute(sql.HEAD, {"agent_id": agent_id, "session_id": session_id})
        row = fetch_row(self.cursor)
        return (0, GENESIS) if row is None else _head_of(row)

    @_raises_store_unavailable
    def reserve_allowance(
        self, request: AllowanceRequest, judge: Callable[[AllowanceHistory], HoldReason | None]
    ) -> tuple[AllowanceHistory, HoldReason | None]:
        ahead = self._history_read
        read = ahead[1] if ahead is not None and ahead[0] is request else None
        history, hold, self._reserved = allowance_reserve(
            request, judge, cursor=self.cursor, read=read
        )
        return history, hold

    @_raises_store_unavailable
    def effect_begin(self, key: str) -> None:
        # The claim left the key in progress; the reservation is otherwise written with the
        # audit record, which this call writes only once its effect answered.
        reserved, self._reserved = self._reserved, None
        if reserved is not None:
            self.cursor.execute(RESERVE, reserved)

    @_raises_store_unavailable
    def release_allowance(self, key: str) -> None:
        reserved = self._reserved
        if reserved is not None and reserved["reserved_key"] == key:
            # Not written yet: it never will be.
            self._reserved = None
            return
        allowance_release(key, cursor=self.cursor)

    def _source(self, lookup: Lookup | None) -> LookupSource | None:
        return None if lookup is None else self.registry.lookup_source(lookup.source)


def _head_of(row: Row) -> tuple[int, str]:
    """The audit head an opening read: (0, GENESIS) for a chain with no record yet."""
    seq = row["audit_seq"]
    return (0, GENESIS) if seq is None else (seq, row["audit_head"])


def _first_decision(request: ClaimRequest) -> tuple[Verdict, KeyStatus]:
    """What the decision table makes of a key seen for the first time."""
    return decide_claim(
        status=KeyStatus.OPEN,
        attempts=1,
        repeat_limit=request.repeat_limit,
        exclusive=request.exclusive,
        confirmation_live=False,
    )


def _settle_params(settlement: Settlement) -> dict[str, Any]:
    return {
        "settled_status": settlement.status.value,
        "settled_result": _db_json(settlement.result),
        "settled_at": _db_time(_now()),
        "settled_key": settlement.key,
    }


def _one(row: Row | None) -> Row:
    if row is None:  # pragma: no cover - an upsert with RETURNING always returns its row
        raise RuntimeError("the claim returned no row")
    return row


def _now() -> datetime:
    return datetime.now(UTC)


def _db_time(moment: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(moment)


def _db_json(value: Mapping[str, Any] | None) -> Any:
    return _JSON_FIELD.get_db_prep_save(value, connection)


def _as_datetime(value: Any) -> datetime | None:
    # PostgreSQL returns datetimes, SQLite text.
    if value is None or isinstance(value, datetime):
        return value.replace(tzinfo=value.tzinfo or UTC) if value else None
    parsed = parse_datetime(str(value))
    return parsed.replace(tzinfo=parsed.tzinfo or UTC) if parsed else None


def _as_json(value: Any) -> Mapping[str, Any] | None:
    # The driver returns JSON as text; Django's field would decode it on a model.
    if value is None or isinstance(value, Mapping):
        return value
    loaded = json.loads(value)
    return loaded if isinstance(loaded, Mapping) else None


def _storable(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and a model can send one in a tool name, in raw arguments
    # or in a field name that a message repeats: the audit keeps it visible, escaped as in JSON.
    return text.replace("\x00", "\\u0000")


def _pending(confirmation_id: str) -> PendingConfirmation | None:
    held = Confirmation.objects.filter(pk=confirmation_id).first()
    if held is None:
        return None
    return PendingConfirmation(
        confirmation_id=held.id,
        key=held.key,
        tool=held.tool,
        arguments=held.arguments,
        arguments_hash=held.arguments_hash,
        agent_id=str(held.agent_id),
        session_id=held.session_id,
        customer_id=held.customer_id,
        policy_version=held.policy_version,
        reviewers_required=held.reviewers_required,
        amount_cents=held.amount_cents,
        created_at=held.created_at,
        expires_at=held.expires_at,
        reason=held.hold_reason,
        status=held.status,
        host_context=held.host_context,
        duplicate_of=held.duplicate_of,
        currency=held.currency,
    )

"""The state port: what the core needs to remember between calls, and an in-memory store.

The Django adapter implements the same port on the ORM (dispatch/store.py); unit tests and the
benchmark use InMemoryState. The decision table for idempotency records lives here, once, so that
every store answers a repeated call the same way.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, NamedTuple, Protocol

from dispatch.pipeline.allowance import (
    APPROVED,
    HELD,
    POLICY,
    REVIEWER,
    AllowanceHistory,
    AllowanceRequest,
    HoldReason,
    Movement,
    execution_key,
)
from dispatch.pipeline.audit_chain import Head, audit_chain, link_hash
from dispatch.pipeline.window import CustomerWindow


class SessionConflict(Exception):
    """The session id is already bound to another customer (an envelope error, not a result)."""


class StoreUnavailable(Exception):
    """The store went away under the call (its connection terminated, say): the call can be
    neither judged nor recorded, and nothing of it is kept. Not a result: the adapter answers it
    as unavailable, and the same call sent again runs anew."""


class KeyStatus(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    # Answered without effect (a rule or a limit refused it): an identical call is judged anew.
    OPEN = "open"
    COMPLETED = "completed"
    HELD = "held"
    # The effect may have happened: an identical call resumes execution with the same key.
    UNKNOWN = "unknown"


class Verdict(enum.StrEnum):
    OWNED = "owned"  # this call runs the remaining stages; the key is now in progress
    PROCEED = "proceed"  # a call without side effects: counted, never locked or replayed
    REPLAY = "replay"
    HELD = "held"
    IN_PROGRESS = "in_progress"
    LOOP = "loop"


class PendingConfirmation(NamedTuple):
    confirmation_id: str
    key: str
    tool: str
    arguments: Mapping[str, Any]
    arguments_hash: str
    agent_id: str
    session_id: str
    customer_id: str
    policy_version: int
    reviewers_required: int
    amount_cents: int | None
    created_at: datetime
    expires_at: datetime
    # Why it is held (allowance.HoldReason as data: kind, message, data).
    reason: Mapping[str, Any] | None = None
    # pending until a human decides; approved, executing or unknown while its execution is due.
    status: str = "pending"
    # The host's context for the reviewer (ToolCall.context).
    host_context: str = ""
    # The money it may repeat (a possible duplicate): the twin movement's key.
    duplicate_of: str = ""
    # The currency of its amount (the tool's money: from its arguments or its subject's state).
    currency: str = ""


class Claim(NamedTuple):
    verdict: Verdict
    attempts: int
    previous: KeyStatus | None = None
    result: Mapping[str, Any] | None = None
    confirmation: PendingConfirmation | None = None


# Module constants for the members decide_claim compares (docs/benchmarks.md, "The core").
_KEY_OPEN, _KEY_COMPLETED = KeyStatus.OPEN, KeyStatus.COMPLETED
_KEY_IN_PROGRESS, _KEY_HELD = KeyStatus.IN_PROGRESS, KeyStatus.HELD
_OWNED, _PROCEED, _REPLAY = Verdict.OWNED, Verdict.PROCEED, Verdict.REPLAY
_HELD, _IN_PROGRESS, _LOOP = Verdict.HELD, Verdict.IN_PROGRESS, Verdict.LOOP


def decide_claim(
    *,
    status: KeyStatus | None,
    attempts: int,
    repeat_limit: int,
    exclusive: bool,
    confirmation_live: bool,
) -> tuple[Verdict, KeyStatus]:
    """Given a key's record (attempts already counted), what this call may do and the new status."""
    current = status or _KEY_OPEN
    if attempts > repeat_limit:
        return _LOOP, current
    if not exclusive:
        return _PROCEED, current
    if current is _KEY_COMPLETED:
        return _REPLAY, current
    if current is _KEY_IN_PROGRESS:
        return _IN_PROGRESS, current
    if current is _KEY_HELD and confirmation_live:
        return _HELD, current
    return _OWNED, _KEY_IN_PROGRESS


class Lookup(NamedTuple):
    """The record a call reads first (ToolSpec.lookup), named by its source and its key.

    The core never reads it. A store that knows the source (ToolRegistry.lookup_source) may read it
    with the call's opening and return it in Opening.read_ahead; a store that does not, ignores it.
    """

    source: str
    key: Mapping[str, Any]


class ReadAhead(NamedTuple):
    """What a store read of a call's lookup when the call opened: the record, or None for none."""

    value: Any


class ClaimRequest(NamedTuple):
    """A key to claim when a call opens (see StatePort.open_call)."""

    key: str
    tool: str
    exclusive: bool
    repeat_limit: int
    now: datetime
    # The record the call reads first, if its tool declares one.
    lookup: Lookup | None = None
    # The money the call would reserve, where its tool's money is its arguments': a store may
    # lock and read its history with the opening (see StatePort.open_call).
    allowance: AllowanceRequest | None = None
    # The confirmation a read of a held call's status names (ToolSpec.watches): the read is
    # free while that call waits (see StatePort.open_call).
    watched: str | None = None


class Opening(NamedTuple):
    step: int
    # None when no claim was asked for, or when the step is over the budget (nothing claimed).
    claim: Claim | None
    # The claim's lookup, if the store read it with the opening; None if it did not.
    read_ahead: ReadAhead | None = None
    # A read of a waiting held call's status: neither the step nor the key's use was counted,
    # and the key was claimed whatever the budget.
    free: bool = False


def watch_is_free(
    confirmation: PendingConfirmation | None, agent_id: str, customer_id: str, now: datetime
) -> bool:
    """Whether a read of this confirmation's status is free: it exists, is the agent's and the
    customer's own, and still waits for a human. Anything else counts as every call does."""
    return (
        confirmation is not None
        and confirmation.agent_id == agent_id
        and confirmation.customer_id == customer_id
        and confirmation.status == "pending"
        and confirmation.expires_at > now
    )


class Settlement(NamedTuple):
    """The status a call leaves its key in, with the result to replay; written with its audit."""

    key: str
    status: KeyStatus
    result: Mapping[str, Any] | None = None


class AuditEntry(NamedTuple):
    call_id: str
    at: datetime
    agent_id: str
    session_id: str
    customer_id: str
    step: int | None
    tool: str
    raw_arguments: str
    arguments: Mapping[str, Any] | None
    key: str | None
    ok: bool
    code: str
    message: str
    replayed: bool
    confirmation_id: str | None
    policy_version: int
    duration_ms: float


class StatePort(Protocol):
    """What the core asks of a store. A call opens with one request and ends with another:
    open_call counts the step and claims the key, record appends the audit record and settles
    the key, each of which a store on a database can do in one statement."""

    def open_call(
        self,
        *,
        agent_id: str,
        session_id: str,
        customer_id: str,
        step_budget: int,
        claim: ClaimRequest | None,
    ) -> Opening:
        """Count one step of the session (binding it on first use); then, only if the new count
        is within step_budget, claim the key as claim() does. Raises SessionConflict.

        A claim that watches a confirmation (ClaimRequest.watched) for which watch_is_free holds
        at the claim's `now` counts neither the step nor the key's use, and its key is claimed
        whatever the budget (Opening.free); the store judges it in the same request as the step.

        Within the budget, a store may also read the claim's lookup in the same request and return
        it as Opening.read_ahead, which the pipeline hands to the tool; ignoring it is always
        correct. So may it lock and read the history of the claim's allowance request, as
        reserve_allowance would, and judge that very request (the same object) by it later in the
        call: nothing else can reserve the customer's money in between."""
        ...

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
        """Atomically count a use of the key and apply decide_claim to its record.

        The core calls it again, with count=False, while an identical call is in progress."""
        ...

    def settle(self, settlement: Settlement) -> None:
        """Leave the key in its final status at once (a call that failed mid-way does)."""
        ...

    def hold(self, confirmation: PendingConfirmation) -> None:
        """Store a pending confirmation and mark its key held, together."""
        ...

    def record(self, entry: AuditEntry, settlement: Settlement | None = None) -> None:
        """Append one audit record, and settle the call's key with it when there is one."""
        ...

    def effect_begin(self, key: str) -> None:
        """A remote write is about to make its effect with no transaction open: write what it
        reserved now, with its key in progress, for the adapter to commit before the effect."""
        ...

    def reserve_allowance(
        self, request: AllowanceRequest, judge: Callable[[AllowanceHistory], HoldReason | None]
    ) -> tuple[AllowanceHistory, HoldReason | None]:
        """Read the history the request is judged by, judge it, and reserve the request's money,
        all atomically: no other reservation of the same customer or agent comes between the
        read and the reservation. If judge finds no reason to hold, the money is reserved as moved
        without a human under the request's key; if it holds and the request names its
        confirmation, as held under the confirmation's execution key until `held_until`. The
        reservation is part of the call's own transaction: it counts once the call commits,
        until release_allowance (or, for held money, a reviewer's decision), and until then no
        other reservation of the same customer or agent is judged."""
        ...

    def release_allowance(self, key: str) -> None:
        """The reserved call did not move its money, or was not held after all: its reservation
        no longer counts."""
        ...


def _day_of(request: AllowanceRequest) -> tuple[str, str, date]:
    return (request.agent_id, request.currency, request.at.date())


@dataclass(slots=True)
class _KeyRecord:
    status: KeyStatus
    attempts: int = 0
    result: Mapping[str, Any] | None = None
    confirmation_id: str | None = None


@dataclass
class InMemoryState:
    """A complete StatePort in a few dicts; thread-safe, forgets everything on exit."""

    sessions: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    keys: dict[str, _KeyRecord] = field(default_factory=dict)
    confirmations: dict[str, PendingConfirmation] = field(default_factory=dict)
    audit: list[AuditEntry] = field(default_factory=list)
    # Each record's link in its session's chain, in the order of `audit`, and the chains' heads
    # (dispatch/pipeline/audit_chain.py), as the database store keeps them.
    links: list[Head] = field(default_factory=list)
    heads: dict[tuple[str, str], Head] = field(default_factory=dict)
    # Reserved money by key (moved, or held for a human), with its customer and currency; released
    # ones are dropped. By customer and currency with the sums that count of it, kept as money
    # comes and goes (dispatch/pipeline/window.py), so that a call's judgement does not read the
    # whole window; what moved without a human summed by agent, currency and day.
    movements: dict[str, tuple[str, str, Movement]] = field(default_factory=dict)
    _windows: dict[tuple[str, str], CustomerWindow] = field(default_factory=dict, repr=False)
    _agent_day: dict[tuple[str, str, date], int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open_call(
        self,
        *,
        agent_id: str,
        session_id: str,
        customer_id: str,
        step_budget: int,
        claim: ClaimRequest | None,
    ) -> Opening:
        with self._lock:
            bound, steps = self.sessions.get((agent_id, session_id), (customer_id, 0))
            if bound != customer_id:
                raise SessionConflict(session_id)
            free = (
                claim is not None
                and claim.watched is not None
                and watch_is_free(
                    self.confirmations.get(claim.watched), agent_id, customer_id, claim.now
                )
            )
            steps += 0 if free else 1
            self.sessions[agent_id, session_id] = (bound, steps)
            if claim is None or (steps > step_budget and not free):
                return Opening(steps, None)
            return Opening(
                steps,
                self._claim(
                    claim.key, claim.exclusive, claim.repeat_limit, claim.now, count=not free
                ),
                free=free,
            )

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
        with self._lock:
            return self._claim(key, exclusive, repeat_limit, now, count=count)

    def _claim(
        self, key: str, exclusive: bool, repeat_limit: int, now: datetime, *, count: bool
    ) -> Claim:
        record = self.keys.get(key)
        if record is None:
            record = self.keys[key] = _KeyRecord(_KEY_OPEN)
            previous = None
        else:
            previous = record.status
        if count:
            record.attempts += 1
        confirmation = (
            self.confirmations.get(record.confirmation_id) if record.confirmation_id else None
        )
        verdict, record.status = decide_claim(
            status=previous,
            attempts=record.attempts,
            repeat_limit=repeat_limit,
            exclusive=exclusive,
            confirmation_live=confirmation is not None and confirmation.expires_at > now,
        )
        return Claim(verdict, record.attempts, previous, record.result, confirmation)

    def settle(self, settlement: Settlement) -> None:
        with self._lock:
            self._settle(settlement)

    def _settle(self, settlement: Settlement) -> None:
        record = self.keys[settlement.key]
        record.status = settlement.status
        record.result = settlement.result

    def hold(self, confirmation: PendingConfirmation) -> None:
        with self._lock:
            self.confirmations[confirmation.confirmation_id] = confirmation
            record = self.keys[confirmation.key]
            record.status = KeyStatus.HELD
            record.confirmation_id = confirmation.confirmation_id

    def record(self, entry: AuditEntry, settlement: Settlement | None = None) -> None:
        with self._lock:
            if settlement is not None:
                self._settle(settlement)
            chain = audit_chain(entry.agent_id, entry.session_id)
            _, seq, previous = self.heads.get((entry.agent_id, entry.session_id), (chain, 0, ""))
            fields = entry._asdict()
            link = Head(
                chain,
                seq + 1,
                link_hash(chain=chain, seq=seq + 1, previous=previous, fields=fields),
            )
            self.heads[entry.agent_id, entry.session_id] = link
            self.links.append(link)
            self.audit.append(entry)

    def effect_begin(self, key: str) -> None:
        # Each change here is visible at once: nothing waits to be written.
        return None

    def reserve_allowance(
        self, request: AllowanceRequest, judge: Callable[[AllowanceHistory], HoldReason | None]
    ) -> tuple[AllowanceHistory, HoldReason | None]:
        with self._lock:
            window = self._windows.get((request.customer_id, request.currency))
            if window is None:
                window = self._windows[request.customer_id, request.currency] = CustomerWindow()
            history = window.history(request, self._agent_day.get(_day_of(request), 0))
            hold = judge(history)
            if hold is None:
                self._reserve(request, request.key, POLICY, None)
                day = _day_of(request)
                self._agent_day[day] = self._agent_day.get(day, 0) + request.amount_cents
            elif request.confirmation_id:
                self._reserve(request, request.held_key, HELD, request.held_until)
            return history, hold

    def _reserve(
        self, request: AllowanceRequest, key: str, approval: str, expires_at: datetime | None
    ) -> None:
        movement = Movement(
            key,
            request.agent_id,
            request.session_id,
            request.tool,
            request.subject,
            request.amount_cents,
            request.at,
            approval,
            request.confirmation_id if approval != POLICY else "",
        )
        self._release(key)
        self.movements[key] = (request.customer_id, request.currency, movement)
        self._windows[request.customer_id, request.currency].reserve(movement, expires_at)

    def release_allowance(self, key: str) -> None:
        with self._lock:
            self._release(key)

    def _release(self, key: str) -> None:
        kept = self.movements.pop(key, None)
        if kept is None:
            return
        customer_id, currency, movement = kept
        self._windows[customer_id, currency].release(key)
        if movement.approval == POLICY:
            day = (movement.agent_id, currency, movement.at.date())
            self._agent_day[day] -= movement.amount_cents

    def held_decided(self, confirmation_id: str, *, approved: bool, at: datetime) -> None:
        """What a reviewer's decision does to a held call's money (the approvals service does it
        on the database): approved, it counts until executed; rejected, it no longer counts."""
        key = execution_key(confirmation_id)
        with self._lock:
            kept = self.movements.get(key)
            if kept is None:
                return
            if not approved:
                self._release(key)
                return
            customer_id, currency, movement = kept
            approved_movement = movement._replace(approval=APPROVED)
            self.movements[key] = (customer_id, currency, approved_movement)
            self._windows[customer_id, currency].replace(key, approved_movement, None)

    def held_executed(self, confirmation_id: str, *, at: datetime) -> None:
        """What an approved held call's execution does to its money (the approvals service does
        it on the database): moved with a reviewer's approval, counting from `at`."""
        key = execution_key(confirmation_id)
        with self._lock:
            kept = self.movements.get(key)
            if kept is None:
                return
            customer_id, currency, movement = kept
            executed = movement._replace(approval=REVIEWER, at=at)
            self.movements[key] = (customer_id, currency, executed)
            self._windows[customer_id, currency].replace(key, executed, None)

    def expire(self, confirmation_id: str, at: datetime) -> None:
        """Move a confirmation's expiry (for tests of expiry)."""
        with self._lock:
            held = self.confirmations[confirmation_id]
            self.confirmations[confirmation_id] = held._replace(expires_at=at)

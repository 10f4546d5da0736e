"""The pipeline: nine stages, in order; the first that fails ends the call with a stable code.

Each stage is named for what it judges, and Pipeline._run calls them in their order: 0
step_budget, 1 allowed_tool and current_tool, 2 strict_json, 3 valid_arguments, 4
Pipeline._idempotency, 5 business_rules, 6 policy_limits, 7 Pipeline._human_confirmation, 8
execute_with_retries. Stages 1 to 3 touch no state and run first (Pipeline.prepare), so that the
store counts the step and claims the key in one request; their verdict still comes after stage
0's.

It never raises for anything a caller sent: every outcome is a CallResult, and every call leaves
exactly one audit record.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from dispatch.pipeline import codes
from dispatch.pipeline.allowance import (
    AllowanceRequest,
    HoldReason,
    allowance_judge,
    always_judge,
    execution_key,
    moneyless_hold,
    never_judge,
    twins_of,
)
from dispatch.pipeline.canonical import arguments_hash, canonical_json, idempotency_key
from dispatch.pipeline.codes import Code
from dispatch.pipeline.messages import describe_validation_error
from dispatch.pipeline.policy import HumanRule, Policy
from dispatch.pipeline.results import CallResult, compact_json, make_result
from dispatch.pipeline.state import (
    AuditEntry,
    Claim,
    ClaimRequest,
    KeyStatus,
    PendingConfirmation,
    ReadAhead,
    SessionConflict,
    Settlement,
    StatePort,
    StoreUnavailable,
    Verdict,
)
from dispatch.pipeline.strictjson import StrictJSONError, check_object, loads_object
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    Money,
    OutcomeUnknownError,
    Refused,
    Risk,
    ToolCall,
    ToolRegistry,
    ToolSpec,
    TransientError,
)

logger = logging.getLogger(__name__)

# Module constants for the members the stages compare (docs/benchmarks.md, "The core").
_OWNED, _REPLAY, _HELD = Verdict.OWNED, Verdict.REPLAY, Verdict.HELD
_IN_PROGRESS, _LOOP = Verdict.IN_PROGRESS, Verdict.LOOP
_KEY_OPEN, _KEY_COMPLETED, _KEY_HELD = KeyStatus.OPEN, KeyStatus.COMPLETED, KeyStatus.HELD
_KEY_UNKNOWN, _KEY_IN_PROGRESS = KeyStatus.UNKNOWN, KeyStatus.IN_PROGRESS
_HIGH_RISK = Risk.HIGH
_NEVER, _ALWAYS, _BY_AMOUNT = HumanRule.NEVER, HumanRule.ALWAYS, HumanRule.BY_AMOUNT


def _allowance_request(
    call: ToolCall,
    spec: ToolSpec[Any],
    key: str,
    money: Money,
    policy: Policy,
    now: datetime,
    confirmation_id: str,
    expires_at: datetime,
) -> AllowanceRequest:
    return AllowanceRequest(
        key=key,
        agent_id=call.agent_id,
        session_id=call.session_id,
        customer_id=call.customer_id,
        tool=spec.name,
        subject=money.subject,
        currency=money.currency,
        amount_cents=money.amount_cents,
        at=now,
        since=now - timedelta(seconds=policy.auto_approve_window_seconds),
        agent_day_needed=_day_cap(policy, money.currency) is not None,
        confirmation_id=confirmation_id,
        held_until=expires_at,
        twins_from=policy.twins_since(now),
    )


def _moves(request: AllowanceRequest, money: Money) -> bool:
    """Whether the request is for exactly this money."""
    return (request.amount_cents, request.currency, request.subject) == (
        money.amount_cents,
        money.currency,
        money.subject,
    )


def _day_cap(policy: Policy, currency: str) -> int | None:
    limits = policy.limits(currency)
    return None if limits is None else limits.daily_cap_cents


@dataclass(frozen=True, slots=True)
class Limits:
    max_argument_bytes: int = 8192
    # How much of the raw arguments the audit keeps.
    audit_raw_chars: int = 4096
    # How long a call waits for an identical one that is still executing.
    in_progress_wait_seconds: float = 3.0
    in_progress_poll_seconds: float = 0.02


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    base_delay_seconds: float = 0.05
    max_delay_seconds: float = 1.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_delay_seconds, self.base_delay_seconds * 2 ** (attempt - 1)))


_utcnow = partial(datetime.now, UTC)


# Ids of calls and confirmations, 32 hex digits: the milliseconds since the epoch (12 digits),
# then 80 bits of the operating system's randomness, read 256 ids' worth at a time. Led by the
# time, a new call's id goes to the right end of the audit records' index on it, not to a random
# page: on a table of millions a random page is seldom cached and is written whole to the WAL
# after each checkpoint, a page per call (docs/benchmarks.md, (b) with a big history). Taking the
# random part is one step of a list iterator, which no two threads can take at once; a forked
# child forgets what its parent read, so that no two processes hand out the same ids.
_IDS_PER_READ = 256
_ids: Iterator[str] = iter(())


def _new_id() -> str:
    global _ids
    tail = next(_ids, None)
    if tail is None:
        digits = os.urandom(10 * _IDS_PER_READ).hex()
        _ids = tails = iter([digits[at : at + 20] for at in range(0, len(digits), 20)])
        tail = next(tails)
    return f"{time.time_ns() // 1_000_000:012x}{tail}"


def _forget_ids() -> None:
    global _ids
    _ids = iter(())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ids)


class _Trace:
    """What the audit record says about a call, filled in as the stages pass."""

    step: int | None = None
    arguments: Mapping[str, Any] | None = None
    key: str | None = None
    confirmation_id: str | None = None
    settlement: Settlement | None = None
    # Whether stage 8 began: after that, a write may have taken effect.
    executing: bool = False
    # Whether a remote write stops before its effect (Pipeline.open_prepared), and where it did.
    defer: bool = False
    effect: PendingEffect | None = None


class CheckedCall(NamedTuple):
    """A call that passed stages 1 to 3."""

    spec: ToolSpec[Any]
    # Its arguments as the tool's model, as JSON values, and those as canonical JSON.
    arguments: BaseModel
    validated: Mapping[str, Any]
    canonical: str
    key: str


class PreparedCall(NamedTuple):
    """A call past stages 1 to 3 (Pipeline.prepare): what it was, and how they judged it."""

    call: ToolCall
    policy: Policy
    call_id: str
    # When the call arrived, by the pipeline's clock and by its monotonic clock.
    at: datetime
    started: float
    # What passed stages 1 to 3, or the result that ended the call there.
    checked: CheckedCall | CallResult

    @property
    def writes(self) -> bool:
        """Whether the call goes on to claim a write's key (an adapter's cue for a transaction)."""
        return not isinstance(self.checked, CallResult) and self.checked.spec.writes


class ClaimedCall(NamedTuple):
    """A call whose key stage 4 gave it, with what the store read as the call opened."""

    checked: CheckedCall
    # The tool's lookup, if the store read it with the opening: stage 5's first read.
    read_ahead: ReadAhead | None
    # The money request stage 7 makes, made before the opening where the tool's money is its
    # arguments' (the store may have read its history with the opening).
    allowance: AllowanceRequest | None


class Execution(NamedTuple):
    """The outcome of stages 5 to 8, and the status it leaves the idempotency key in."""

    result: CallResult
    status: KeyStatus


class PendingEffect(NamedTuple):
    """A remote write (ToolSpec.remote) that passed every stage, stopped before its effect: its
    key is in progress and its money reserved, which the adapter commits before the effect
    (Pipeline.effect_make), and settles after it (Pipeline.effect_end)."""

    prepared: PreparedCall
    claimed: ClaimedCall
    # The money it reserved, released if the effect is certainly not made.
    money: Money | None
    read_ahead: ReadAhead | None
    trace: _Trace


class Refusal(NamedTuple):
    """Why a call does not pass a stage: its code, words for the model, and data."""

    code: Code
    message: str
    data: Mapping[str, Any] = {}


def _rejected(
    call: ToolCall,
    call_id: str,
    code: Code,
    message: str,
    data: Mapping[str, Any] | None = None,
) -> CallResult:
    """A result that ends the call before stage 5."""
    return make_result(call_id=call_id, tool=call.tool, code=code, message=message, data=data)


def _internal_error(call: ToolCall, call_id: str) -> CallResult:
    return make_result(
        call_id=call_id,
        tool=call.tool,
        code=codes.INTERNAL_ERROR,
        message="Toolgate failed while handling this call.",
    )


def _deferred(spec: ToolSpec[Any], call_id: str) -> CallResult:
    """What stands for a remote write's result until its effect answers: never returned."""
    return make_result(
        call_id=call_id,
        tool=spec.name,
        code=codes.CALL_IN_PROGRESS,
        message="The call is executing.",
    )


def _answered(
    spec: ToolSpec[Any],
    call_id: str,
    status: KeyStatus,
    code: Code,
    message: str,
    data: Mapping[str, Any] | None = None,
    retryable: bool | None = None,
) -> Execution:
    """A result of stages 5 to 8, with the status it leaves the key in."""
    result = make_result(
        call_id=call_id, tool=spec.name, code=code, message=message, data=data, retryable=retryable
    )
    return Execution(result, status)


# The stages, in order --------------------------------------------------------------------------


def step_budget(step: int, policy: Policy) -> Refusal | None:
    """Stage 0: the session's calls, this one counted, within the policy's budget."""
    if step <= policy.step_budget:
        return None
    return Refusal(
        codes.STEP_LIMIT,
        f"This session has used its budget of {policy.step_budget} calls; "
        "hand the conversation over to a human.",
    )


def allowed_tool(registry: ToolRegistry, policy: Policy, name: str) -> ToolSpec[Any] | Refusal:
    """Stage 1: the tool of that name, if it exists and is on the policy's allowlist."""
    spec = registry.get(name)
    if spec is None:
        offered = sorted(t.name for t in registry.listed() if t.name in policy.allowed_tools)
        return Refusal(
            codes.UNKNOWN_TOOL,
            f"tool: no tool is named {name[:64]!r} "
            f"(the tools you can call are: {', '.join(offered) or 'none'})",
        )
    if spec.name not in policy.allowed_tools:
        return Refusal(codes.TOOL_NOT_ALLOWED, f"tool: {spec.name} is not allowed for this agent")
    return spec


def current_tool(registry: ToolRegistry, policy: Policy, spec: ToolSpec[Any]) -> Refusal | None:
    """Stage 1, for a model's call: the tool is not retired. A held call of a retired tool is
    not judged by it (recheck): the reviewers still decide it under the tool's own rules."""
    if not spec.retired:
        return None
    successor = registry.successor_of(spec.name)
    if successor is None:
        return Refusal(
            codes.TOOL_RETIRED,
            f"tool: {spec.name} is retired and has no successor (do not call it again; hand the "
            "conversation over to a human)",
            {"successor": None, "successor_allowed": False},
        )
    allowed = successor in policy.allowed_tools
    advice = (
        f"call {successor} instead, with its own arguments (read its schema)"
        if allowed
        else f"its successor {successor} is not allowed for this agent: hand the conversation "
        "over to a human"
    )
    return Refusal(
        codes.TOOL_RETIRED,
        f"tool: {spec.name} is retired; {advice}",
        {"successor": successor, "successor_allowed": allowed},
    )


def strict_json(
    spec: ToolSpec[Any], raw: str | Mapping[str, Any], max_bytes: int
) -> dict[str, Any] | Refusal:
    """Stage 2: the arguments as one strict JSON object within the size limit."""
    try:
        if isinstance(raw, str):
            return loads_object(raw, max_bytes=max_bytes)
        return check_object(raw, max_bytes=max_bytes)
    except StrictJSONError as exc:
        return Refusal(
            codes.INVALID_JSON,
            f"arguments: {exc} (send exactly one JSON object with the fields: "
            f"{', '.join(spec.arguments.model_fields)})",
        )


def valid_arguments(spec: ToolSpec[Any], document: Mapping[str, Any]) -> BaseModel | Refusal:
    """Stage 3: the arguments validated strictly against the tool's schema."""
    try:
        # model_validate, called on pydantic's validator directly.
        model: BaseModel = spec.arguments.__pydantic_validator__.validate_python(
            document, strict=True
        )
    except ValidationError as exc:
        return Refusal(codes.INVALID_ARGUMENTS, describe_validation_error(spec.arguments, exc))
    return model


# Stage 4, idempotency, is the store's claim of the key: Pipeline._idempotency.


def business_rules(
    spec: ToolSpec[Any], arguments: BaseModel, context: CheckContext
) -> Refusal | None:
    """Stage 5: the tool's business rules against the live state."""
    if spec.check is None:
        return None
    rejection = spec.check(arguments, context)
    if rejection is None:
        return None
    return Refusal(rejection.code, rejection.message, rejection.data)


def policy_limits(spec: ToolSpec[Any], money: Money | None, policy: Policy) -> Refusal | None:
    """Stage 6: the money the call moves within the policy's maximum per call."""
    if money is None:
        return None
    limits = policy.limits(money.currency)
    # A currency without thresholds has no maximum either: it is held for a human (stage 7).
    if limits is None or money.amount_cents <= limits.max_amount_cents:
        return None
    return over_maximum(
        spec.amount_field or "amount", money.amount_cents, money.currency, limits.max_amount_cents
    )


def over_maximum(field: str, amount_cents: int, currency: str, limit_cents: int) -> Refusal:
    """Stage 6's refusal of an amount above the policy's maximum per call."""
    return Refusal(
        codes.POLICY_LIMIT,
        f"{field}: {amount_cents} is above this agent's limit of {limit_cents} {currency} per "
        "call (a human must handle larger amounts)",
        {"limit_cents": limit_cents, "currency": currency},
    )


# Stage 7, human confirmation, reserves or holds the money in the store:
# Pipeline._human_confirmation. Stage 8 is execute_with_retries.


def rules_refusal(
    spec: ToolSpec[Any],
    arguments: BaseModel,
    customer_id: str,
    policy: Policy,
    read_ahead: ReadAhead | None = None,
) -> Refusal | Money | None:
    """Stages 5 and 6: the tool's business rules against the live state, then the policy's
    limits. What passes is the money the call moves (None for none)."""
    context = CheckContext(customer_id, read_ahead)
    refusal = business_rules(spec, arguments, context)
    if refusal is not None:
        return refusal
    # What was read ahead is the check's first read: a tool with a check reads its money live.
    money = spec.money_of(arguments, CheckContext(customer_id, None) if spec.check else context)
    refusal = policy_limits(spec, money, policy)
    return money if refusal is None else refusal


def recheck(
    registry: ToolRegistry,
    policy: Policy,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    customer_id: str,
) -> tuple[ToolSpec[Any], BaseModel] | Refusal:
    """Judge a held call again, as the pipeline judged it, under this policy and the state of
    this moment: the allowlist, the arguments validated again, business rules, policy limits.

    What approval runs before a confirmation may execute (stage 7's allowance is not part of it:
    a human is approving the money)."""
    spec = allowed_tool(registry, policy, tool)
    if isinstance(spec, Refusal):
        return spec
    model = valid_arguments(spec, arguments)
    if isinstance(model, Refusal):
        return model
    judged = rules_refusal(spec, model, customer_id, policy)
    return judged if isinstance(judged, Refusal) else (spec, model)


class Pipeline:
    def __init__(
        self,
        registry: ToolRegistry,
        state: StatePort | None = None,
        *,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        new_id: Callable[[], str] = _new_id,
    ) -> None:
        self.registry = registry
        self.state = state
        self.limits = limits or Limits()
        self.retry = retry or RetryPolicy()
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.new_id = new_id

    def on_clock(self, clock: Callable[[], datetime]) -> Pipeline:
        """The same pipeline, telling the time by `clock`."""
        other = copy.copy(self)
        other.clock = clock
        return other

    def run(self, call: ToolCall, policy: Policy) -> CallResult:
        """One call, start to finish, on the pipeline's own store."""
        if self.state is None:
            raise TypeError("this pipeline has no store of its own: use run_prepared")
        return self.run_prepared(self.prepare(call, policy), self.state)

    def prepare(self, call: ToolCall, policy: Policy) -> PreparedCall:
        """Stages 1 to 3, which need nothing but the call: they touch no state.

        So an adapter knows, before it opens anything, whether the call writes (and needs a
        transaction around the rest); run_prepared then runs the rest on a store.
        """
        started = self.monotonic()
        # When the call arrived: the time its audit record gives, and the claim's "now".
        at = self.clock()
        call_id = self.new_id()
        try:
            checked = self._stages_1_to_3(call, policy, call_id)
        except Exception:
            logger.exception("pipeline failed on call %s", call_id)
            checked = _internal_error(call, call_id)
        return PreparedCall(call, policy, call_id, at, started, checked)

    def run_prepared(self, prepared: PreparedCall, state: StatePort) -> CallResult:
        """Stage 0 and stages 4 to 8 on the store given, then the call's one audit record."""
        trace = _Trace()
        result = self._guarded_run(prepared, trace, state)
        self._record(prepared, trace, result, state)
        return result

    def open_prepared(self, prepared: PreparedCall, state: StatePort) -> CallResult | PendingEffect:
        """run_prepared, except that a remote write that passes every stage stops before its
        effect: its money reserved and its key in progress are written (StatePort.effect_begin)
        for the adapter to commit, and no audit record yet. The adapter then makes the effect
        with no transaction open (effect_make) and settles it on a store of its own
        (effect_end), which writes the call's one audit record."""
        trace = _Trace()
        trace.defer = True
        result = self._guarded_run(prepared, trace, state)
        effect = trace.effect
        if effect is not None:
            state.effect_begin(effect.claimed.checked.key)
            return effect
        self._record(prepared, trace, result, state)
        return result

    def effect_make(self, effect: PendingEffect) -> Execution:
        """A remote write's effect, under the call's key, with no store at hand."""
        return self._execution(effect.claimed, effect.prepared, effect.read_ahead)

    def effect_end(
        self, effect: PendingEffect, execution: Execution, state: StatePort
    ) -> CallResult:
        """Settle a remote write as its effect answered, and write the call's audit record."""
        result, status = execution
        key = effect.claimed.checked.key
        if status is _KEY_OPEN and (
            effect.money is not None or effect.claimed.checked.spec.money is not None
        ):
            # Certainly not made: the money it reserved (this call, or the one it finishes) is
            # free again.
            state.release_allowance(key)
        stored = result.as_dict() if status is _KEY_COMPLETED else None
        effect.trace.settlement = Settlement(key, status, stored)
        self._record(effect.prepared, effect.trace, result, state)
        return result

    def _guarded_run(self, prepared: PreparedCall, trace: _Trace, state: StatePort) -> CallResult:
        call, call_id = prepared.call, prepared.call_id
        try:
            return self._run(prepared, trace, state)
        except (SessionConflict, StoreUnavailable):
            raise
        except Exception:
            logger.exception("pipeline failed on call %s", call_id)
            trace.effect = None
            return _internal_error(call, call_id)

    def _record(
        self, prepared: PreparedCall, trace: _Trace, result: CallResult, state: StatePort
    ) -> None:
        call, policy, call_id = prepared.call, prepared.policy, prepared.call_id
        entry = AuditEntry(
            call_id=call_id,
            at=prepared.at,
            agent_id=call.agent_id,
            session_id=call.session_id,
            customer_id=call.customer_id,
            step=trace.step,
            tool=call.tool,
            raw_arguments=self._raw_for_audit(call.arguments),
            arguments=trace.arguments,
            key=trace.key,
            ok=result.ok,
            code=result.code,
            message=result.message,
            replayed=result.replayed,
            confirmation_id=trace.confirmation_id,
            policy_version=policy.version,
            duration_ms=(self.monotonic() - prepared.started) * 1000.0,
        )
        state.record(entry, trace.settlement)

    def _run(self, prepared: PreparedCall, trace: _Trace, state: StatePort) -> CallResult:
        call, policy, call_id = prepared.call, prepared.policy, prepared.call_id
        # The store counts the step (stage 0) and claims the key (stage 4) in one request, so
        # the claim is asked for with the step; stages 1 to 3 made its key before (prepare), and
        # their verdict still comes after stage 0's: a call over its budget is refused whatever
        # it holds.
        request = self._claim_request(prepared)
        opening = state.open_call(
            agent_id=call.agent_id,
            session_id=call.session_id,
            customer_id=call.customer_id,
            step_budget=policy.step_budget,
            claim=request,
        )

        # 0. Step budget: the cheapest check, and it bounds every loop an agent can get into;
        # a read of a held call's status while it waits is not counted (ToolSpec.watches).
        trace.step = opening.step
        refusal = None if opening.free else step_budget(opening.step, policy)
        if refusal is not None:
            return _rejected(call, call_id, refusal.code, refusal.message)

        # 1 to 3. A known and allowed tool, one strict JSON object, the tool's schema.
        checked = prepared.checked
        if isinstance(checked, CallResult):
            return checked
        trace.arguments = checked.validated
        trace.key = checked.key

        # 4. Idempotency: replay what completed, return what is held, stop what loops.
        claim = self._idempotency(opening.claim, prepared, checked, trace, state)
        if isinstance(claim, CallResult):
            return claim
        claimed = ClaimedCall(
            checked, opening.read_ahead, None if request is None else request.allowance
        )
        if claim.verdict is not _OWNED:
            # A read: nothing to settle.
            return self._stages_5_to_8(claimed, prepared, trace, state).result

        key, spec = checked.key, checked.spec
        try:
            if claim.previous is _KEY_UNKNOWN:
                # The effect may already have happened: finish it under the same key rather than
                # judge it again against a state that it may itself have changed.
                if spec.remote and trace.defer:
                    trace.effect = PendingEffect(prepared, claimed, None, None, trace)
                    return _deferred(spec, call_id)
                execution = self._execution(claimed, prepared)
            else:
                execution = self._stages_5_to_8(claimed, prepared, trace, state)
        except BaseException:
            may_have_happened = spec.writes and (trace.executing or claim.previous is _KEY_UNKNOWN)
            state.settle(Settlement(key, _KEY_UNKNOWN if may_have_happened else _KEY_OPEN))
            raise
        result, status = execution
        if trace.effect is not None:
            return result
        if status is not _KEY_HELD:
            stored = result.as_dict() if status is _KEY_COMPLETED else None
            # Written with the audit record, in the same request to the store.
            trace.settlement = Settlement(key, status, stored)
        return result

    def _claim_request(self, prepared: PreparedCall) -> ClaimRequest | None:
        """What the call's opening asks of the store besides counting its step: its key's
        claim, the record its tool reads first and, where its money is its arguments', the
        money request of stage 7 (a store may lock and read its history with the opening)."""
        checked = prepared.checked
        if isinstance(checked, CallResult):
            return None
        call, policy = prepared.call, prepared.policy
        spec, arguments = checked.spec, checked.arguments
        lookup = spec.lookup
        # Not for a remote tool: its check reads the upstream, and the money lock a store may
        # take with the opening must not be held across that read.
        money = spec.money_ahead(arguments) if spec.writes and not spec.remote else None
        allowance = None
        if money is not None:
            now = self.clock()
            expires_at = now + timedelta(seconds=policy.confirmation_ttl_seconds)
            allowance = _allowance_request(
                call, spec, checked.key, money, policy, now, self.new_id(), expires_at
            )
        return ClaimRequest(
            checked.key,
            spec.name,
            spec.writes,
            policy.repeat_limit,
            prepared.at,
            None if lookup is None else lookup(arguments, call.customer_id),
            allowance,
            spec.watched_of(arguments),
        )

    def _stages_1_to_3(
        self, call: ToolCall, policy: Policy, call_id: str
    ) -> CheckedCall | CallResult:
        """Stages 1 to 3, and the idempotency key of what passes them."""
        # 1. Known tool, and on this agent's allowlist.
        spec = allowed_tool(self.registry, policy, call.tool)
        if isinstance(spec, Refusal):
            return _rejected(call, call_id, spec.code, spec.message)
        retired = current_tool(self.registry, policy, spec)
        if retired is not None:
            return _rejected(call, call_id, retired.code, retired.message, retired.data)

        # 2. One strict JSON object within the size limit.
        document = strict_json(spec, call.arguments, self.limits.max_argument_bytes)
        if isinstance(document, Refusal):
            return _rejected(call, call_id, document.code, document.message)

        # 3. The tool's schema, strictly: no coercion, no unknown fields.
        arguments = valid_arguments(spec, document)
        if isinstance(arguments, Refusal):
            return _rejected(call, call_id, arguments.code, arguments.message)
        # model_dump, called on pydantic's serializer directly.
        validated = arguments.__pydantic_serializer__.to_python(arguments, mode="json")
        canonical = canonical_json(validated)
        key = idempotency_key(
            agent_id=call.agent_id, session_id=call.session_id, tool=spec.name, canonical=canonical
        )
        return CheckedCall(spec, arguments, validated, canonical, key)

    def _idempotency(
        self,
        claim: Claim | None,
        prepared: PreparedCall,
        checked: CheckedCall,
        trace: _Trace,
        state: StatePort,
    ) -> Claim | CallResult:
        """Stage 4: the key's claim, once an identical call still executing has finished (or
        the wait is over); the answer that ends the call here, if it does not own the key."""
        if claim is None:  # pragma: no cover - a store that breaks the port's contract
            raise RuntimeError("the store counted the step but claimed no key")
        call, policy, call_id = prepared.call, prepared.policy, prepared.call_id
        spec = checked.spec
        if claim.verdict is _IN_PROGRESS:
            deadline = self.monotonic() + self.limits.in_progress_wait_seconds
            while claim.verdict is _IN_PROGRESS and self.monotonic() < deadline:
                self.sleep(self.limits.in_progress_poll_seconds)
                claim = state.claim(
                    key=checked.key,
                    agent_id=call.agent_id,
                    session_id=call.session_id,
                    tool=spec.name,
                    exclusive=spec.writes,
                    repeat_limit=policy.repeat_limit,
                    now=self.clock(),
                    count=False,
                )
        if claim.verdict is _LOOP:
            return _rejected(
                call,
                call_id,
                codes.LOOP_DETECTED,
                f"This exact call was already sent {claim.attempts - 1} times in this session; "
                "repeating it will not change the answer. Tell the user what happened instead.",
            )
        if claim.verdict is _REPLAY and claim.result is not None:
            return self._replay(call_id, claim.result)
        if claim.verdict is _HELD and claim.confirmation is not None:
            trace.confirmation_id = claim.confirmation.confirmation_id
            return self._held(call_id, claim.confirmation, replayed=True)
        if claim.verdict is _IN_PROGRESS:
            return _rejected(
                call,
                call_id,
                codes.CALL_IN_PROGRESS,
                "An identical call is still executing; send it again in a moment for its result.",
            )
        return claim

    def _stages_5_to_8(
        self, claimed: ClaimedCall, prepared: PreparedCall, trace: _Trace, state: StatePort
    ) -> Execution:
        call, policy, call_id = prepared.call, prepared.policy, prepared.call_id
        spec, arguments = claimed.checked.spec, claimed.checked.arguments
        read_ahead = claimed.read_ahead

        # 5. Business rules against the live state; what was read ahead is the check's first read.
        context = CheckContext(call.customer_id, read_ahead)
        refusal = business_rules(spec, arguments, context)
        if refusal is not None:
            return _answered(spec, call_id, _KEY_OPEN, refusal.code, refusal.message, refusal.data)

        # 6. The agent's policy limits, on the money the call moves (read live by a tool with a
        # check: what was read ahead was the check's).
        money = spec.money_of(
            arguments, CheckContext(call.customer_id, None) if spec.check else context
        )
        refusal = policy_limits(spec, money, policy)
        if refusal is not None:
            return _answered(spec, call_id, _KEY_OPEN, refusal.code, refusal.message, refusal.data)

        # 7. A human decides where the policy says so; money moved without one is reserved.
        held = self._human_confirmation(claimed, money, prepared, trace, state)
        if held is not None:
            return Execution(held, _KEY_HELD)

        # 8. Execution. What was read ahead is the first read of the tool's check, if it has one.
        trace.executing = True
        if spec.remote and trace.defer:
            read = None if spec.check else read_ahead
            trace.effect = PendingEffect(prepared, claimed, money, read, trace)
            return Execution(_deferred(spec, call_id), _KEY_IN_PROGRESS)
        execution = self._execution(claimed, prepared, None if spec.check else read_ahead)
        if money is not None and execution.status is _KEY_OPEN:
            # Nothing moved (refused, or not applied): the money it reserved is free again.
            state.release_allowance(claimed.checked.key)
        return execution

    def _human_confirmation(
        self,
        claimed: ClaimedCall,
        money: Money | None,
        prepared: PreparedCall,
        trace: _Trace,
        state: StatePort,
    ) -> CallResult | None:
        """Stage 7: the held call's answer where a human decides, for the tool always or by its
        money (the customer's sum, dispatch/pipeline/allowance.py); None where it goes on to
        execute, its money (if any) reserved so that it counts in the sum. Only calls that would
        succeed get here."""
        call, policy = prepared.call, prepared.policy
        spec, _, validated, canonical, key = claimed.checked
        rule = policy.human_rule(spec.name, high_risk=spec.risk is _HIGH_RISK)
        if money is None and rule is _NEVER:
            return None
        ahead = claimed.allowance
        if ahead is not None and money is not None and _moves(ahead, money):
            # Made with the opening, which a store may have read its history with.
            now, confirmation_id = ahead.at, ahead.confirmation_id
        else:
            ahead = None
            now = self.clock()
            # The id it is held under, if it is: its money is reserved as held with the
            # judgement.
            confirmation_id = self.new_id()
        expires_at = now + timedelta(seconds=policy.confirmation_ttl_seconds)
        duplicate_of = ""
        if money is None:
            hold: HoldReason | None = moneyless_hold(spec.name, always=rule is _ALWAYS)
            total = None
        else:
            request = ahead or _allowance_request(
                call, spec, key, money, policy, now, confirmation_id, expires_at
            )
            judge = (
                partial(allowance_judge, policy, request)
                if rule is _BY_AMOUNT
                else partial(always_judge, spec.name, request)
                if rule is _ALWAYS
                else never_judge
            )
            history, hold = state.reserve_allowance(request, judge)
            # The money is the risk: the customer's sum with it decides how many reviewers.
            total = history.customer_window_cents + money.amount_cents
            twins = twins_of(request, history)
            duplicate_of = twins[0].key if twins else ""
        if hold is None:
            return None
        confirmation = PendingConfirmation(
            confirmation_id=confirmation_id,
            key=key,
            tool=spec.name,
            arguments=dict(validated),
            arguments_hash=arguments_hash(canonical),
            agent_id=call.agent_id,
            session_id=call.session_id,
            customer_id=call.customer_id,
            policy_version=policy.version,
            reviewers_required=policy.reviewers_required(total, money.currency if money else ""),
            amount_cents=money.amount_cents if money else None,
            created_at=now,
            expires_at=expires_at,
            reason=hold._asdict(),
            host_context=call.context,
            duplicate_of=duplicate_of,
            currency=money.currency if money else "",
        )
        try:
            state.hold(confirmation)
        except BaseException:
            # Not held after all: its money is not on its way.
            if money is not None:
                state.release_allowance(execution_key(confirmation_id))
            raise
        trace.confirmation_id = confirmation.confirmation_id
        return self._held(prepared.call_id, confirmation, replayed=False)

    def _execution(
        self, claimed: ClaimedCall, prepared: PreparedCall, read_ahead: ReadAhead | None = None
    ) -> Execution:
        """Stage 8, under the call's key."""
        call = prepared.call
        checked = claimed.checked
        return execute_with_retries(
            checked.spec,
            checked.arguments,
            ExecutionContext(call.customer_id, checked.key, (), read_ahead, call.agent_id),
            call_id=prepared.call_id,
            retry=self.retry,
            sleep=self.sleep,
        )

    def _replay(self, call_id: str, stored: Mapping[str, Any]) -> CallResult:
        first = CallResult.from_dict(stored)
        return replace(
            first,
            call_id=call_id,
            replayed=True,
            model_text=f"REPLAY (an identical earlier call already ran; nothing was done again) "
            f"{first.model_text}",
        )

    def _held(
        self, call_id: str, confirmation: PendingConfirmation, *, replayed: bool
    ) -> CallResult:
        data = confirmation_data(confirmation)
        if confirmation.status == "pending":
            message = (
                f"{confirmation.tool} is held for human approval as confirmation "
                f"{confirmation.confirmation_id}, until {data['expires_at']}"
                + (f": {confirmation.reason['message']}." if confirmation.reason else ".")
            )
        else:
            message = (
                f"{confirmation.tool} was approved as confirmation "
                f"{confirmation.confirmation_id} and is {confirmation.status}; "
                "send the same call again later for its result."
            )
        result = make_result(
            call_id=call_id,
            tool=confirmation.tool,
            code=codes.CONFIRMATION_REQUIRED,
            message=message,
            data=data,
        )
        return replace(result, replayed=True) if replayed else result

    def _raw_for_audit(self, raw: str | Mapping[str, Any]) -> str:
        if isinstance(raw, str):
            text = raw
        else:
            try:
                text = compact_json(raw)
            except (TypeError, ValueError):
                text = repr(raw)
        return text[: self.limits.audit_raw_chars]


def confirmation_data(confirmation: PendingConfirmation) -> dict[str, Any]:
    return {
        "confirmation_id": confirmation.confirmation_id,
        "status": confirmation.status,
        "expires_at": confirmation.expires_at.isoformat(),
        "arguments": dict(confirmation.arguments),
        "reviewers_required": confirmation.reviewers_required,
        "reason": dict(confirmation.reason) if confirmation.reason else None,
    }


def execute_with_retries(
    spec: ToolSpec[Any],
    arguments: BaseModel,
    context: ExecutionContext,
    *,
    call_id: str,
    retry: RetryPolicy,
    sleep: Callable[[float], None],
) -> Execution:
    """Stage 8: run the handler, retrying transient failures only, always with the same key."""
    uncertain = False
    for attempt in range(1, retry.attempts + 1):
        try:
            data = spec.handler(arguments, context)
        except Refused as refused:
            if uncertain and spec.writes:
                # A refusal now says nothing of an earlier attempt that may have taken effect
                # (one refused before it was sent, as a tool the upstream changed): the outcome
                # stays unknown and its money counted until the effect is read.
                break
            rejection = refused.rejection
            return _answered(
                spec, call_id, _KEY_OPEN, rejection.code, rejection.message, rejection.data
            )
        except TransientError:
            pass
        except OutcomeUnknownError:
            uncertain = True
        except Exception:
            logger.exception("handler of %s failed on call %s", spec.name, call_id)
            if spec.writes:
                return _answered(
                    spec,
                    call_id,
                    _KEY_UNKNOWN,
                    codes.INTERNAL_ERROR,
                    "Toolgate failed while executing this call, and whether it took effect "
                    "is not known. Do not send it again; tell the user it is being checked.",
                    {"outcome": "unknown"},
                )
            return _answered(
                spec,
                call_id,
                _KEY_OPEN,
                codes.INTERNAL_ERROR,
                "Toolgate failed while executing this call.",
                {},
            )
        else:
            return _answered(spec, call_id, _KEY_COMPLETED, codes.OK, "Done.", data)
        if attempt < retry.attempts:
            sleep(retry.delay(attempt))

    if uncertain and spec.writes:
        return _answered(
            spec,
            call_id,
            _KEY_UNKNOWN,
            codes.UPSTREAM_UNAVAILABLE,
            f"The system of record did not confirm {spec.name} after {retry.attempts} "
            "attempts: it may or may not have taken effect. Do not send it again blindly; "
            "check the current state first, or tell the user it is being verified.",
            {"outcome": "unknown", "attempts": retry.attempts},
            retryable=False,
        )
    return _answered(
        spec,
        call_id,
        _KEY_OPEN,
        codes.UPSTREAM_UNAVAILABLE,
        f"The system of record is unavailable; nothing was done after {retry.attempts} "
        "attempts. The same call may succeed shortly.",
        {"outcome": "not_applied", "attempts": retry.attempts},
    )

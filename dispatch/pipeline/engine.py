"""The pipeline: nine stages, in order; the first that fails ends the call with a stable code.

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
from typing import Any, NamedTuple, TypeAlias

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
_KEY_UNKNOWN = KeyStatus.UNKNOWN
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


# A call that passed stages 1 to 3: its tool, its arguments (the model, and as JSON values), their
# canonical JSON and its idempotency key.
_Checked: TypeAlias = tuple[ToolSpec[Any], BaseModel, Mapping[str, Any], str, str]
# The same, with what the store read ahead when the call opened: what stages 5 to 8 work on.
# What stages 5 to 8 start from: the checked call, what the opening read ahead, and the money
# request made with it (if any).
_CheckedCall: TypeAlias = tuple[
    ToolSpec[Any], BaseModel, Mapping[str, Any], str, ReadAhead | None, AllowanceRequest | None
]
# The outcome of stages 5 to 8 and the status it leaves the idempotency key in.
Execution: TypeAlias = tuple[CallResult, KeyStatus]


class PreparedCall(NamedTuple):
    """A call past stages 1 to 3 (Pipeline.prepare): what it was, and how they judged it."""

    call: ToolCall
    policy: Policy
    call_id: str
    # When the call arrived, by the pipeline's clock and by its monotonic clock.
    at: datetime
    started: float
    # What passed stages 1 to 3, or the result that ended the call there.
    checked: _Checked | CallResult

    @property
    def writes(self) -> bool:
        """Whether the call goes on to claim a write's key (an adapter's cue for a transaction)."""
        return not isinstance(self.checked, CallResult) and self.checked[0].writes


def _rejected(call: ToolCall, call_id: str, code: Code, message: str) -> CallResult:
    """A result that ends the call before stage 5."""
    return make_result(call_id=call_id, tool=call.tool, code=code, message=message)


def _internal_error(call: ToolCall, call_id: str) -> CallResult:
    return make_result(
        call_id=call_id,
        tool=call.tool,
        code=codes.INTERNAL_ERROR,
        message="Toolgate failed while handling this call.",
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
    return result, status


class Refusal(NamedTuple):
    """Why a call does not pass a check: its code, words for the model, and data."""

    code: Code
    message: str
    data: Mapping[str, Any] = {}


def allowed_tool(registry: ToolRegistry, policy: Policy, name: str) -> ToolSpec[Any] | Refusal:
    """Stage 1: the tool of that name, if it exists and is on the policy's allowlist."""
    spec = registry.get(name)
    if spec is None:
        offered = sorted(t.name for t in registry if t.name in policy.allowed_tools)
        return Refusal(
            codes.UNKNOWN_TOOL,
            f"tool: no tool is named {name[:64]!r} "
            f"(the tools you can call are: {', '.join(offered) or 'none'})",
        )
    if spec.name not in policy.allowed_tools:
        return Refusal(codes.TOOL_NOT_ALLOWED, f"tool: {spec.name} is not allowed for this agent")
    return spec


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
    if spec.check is not None:
        rejection = spec.check(arguments, context)
        if rejection is not None:
            return Refusal(rejection.code, rejection.message, rejection.data)
    money = spec.money_of(arguments, CheckContext(customer_id, None) if spec.check else context)
    if money is None:
        return None
    limits = policy.limits(money.currency)
    # A currency without thresholds has no maximum either: it is held for a human (stage 7).
    if limits is not None and money.amount_cents > limits.max_amount_cents:
        return over_maximum(
            spec.amount_field or "amount",
            money.amount_cents,
            money.currency,
            limits.max_amount_cents,
        )
    return money


def over_maximum(field: str, amount_cents: int, currency: str, limit_cents: int) -> Refusal:
    """Stage 6's refusal of an amount above the policy's maximum per call."""
    return Refusal(
        codes.POLICY_LIMIT,
        f"{field}: {amount_cents} is above this agent's limit of {limit_cents} {currency} per "
        "call (a human must handle larger amounts)",
        {"limit_cents": limit_cents, "currency": currency},
    )


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
        call, policy, call_id = prepared.call, prepared.policy, prepared.call_id
        trace = _Trace()
        try:
            result = self._run(prepared, trace, state)
        except (SessionConflict, StoreUnavailable):
            raise
        except Exception:
            logger.exception("pipeline failed on call %s", call_id)
            result = _internal_error(call, call_id)
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
        return result

    def _run(self, prepared: PreparedCall, trace: _Trace, state: StatePort) -> CallResult:
        call, policy, call_id, checked = (
            prepared.call,
            prepared.policy,
            prepared.call_id,
            prepared.checked,
        )
        # Stages 1 to 3 ran first, so that the store counts the step and claims the key in one
        # request. Their verdict still comes second: a call over its budget is refused whatever
        # it holds.
        if isinstance(checked, CallResult):
            request = None
        else:
            spec, arguments, validated, canonical, key = checked
            lookup = spec.lookup
            allowance = self._allowance_ahead(spec, arguments, call, policy, key)
            request = ClaimRequest(
                key,
                spec.name,
                spec.writes,
                policy.repeat_limit,
                prepared.at,
                None if lookup is None else lookup(arguments, call.customer_id),
                allowance,
            )

        # 0. Step budget: the cheapest check, and it bounds every loop an agent can get into.
        opening = state.open_call(
            agent_id=call.agent_id,
            session_id=call.session_id,
            customer_id=call.customer_id,
            step_budget=policy.step_budget,
            claim=request,
        )
        trace.step = opening.step
        if opening.step > policy.step_budget:
            return _rejected(
                call,
                call_id,
                codes.STEP_LIMIT,
                f"This session has used its budget of {policy.step_budget} calls; "
                "hand the conversation over to a human.",
            )
        if isinstance(checked, CallResult):
            return checked
        trace.arguments = validated
        trace.key = key
        claim = opening.claim
        if claim is None:  # pragma: no cover - a store that breaks the port's contract
            raise RuntimeError("the store counted the step but claimed no key")

        # 4. Idempotency: replay what completed, return what is held, stop what loops.
        if claim.verdict is _IN_PROGRESS:
            deadline = self.monotonic() + self.limits.in_progress_wait_seconds
            while claim.verdict is _IN_PROGRESS and self.monotonic() < deadline:
                self.sleep(self.limits.in_progress_poll_seconds)
                claim = state.claim(
                    key=key,
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
        checked_call: _CheckedCall = (
            spec,
            arguments,
            validated,
            canonical,
            opening.read_ahead,
            allowance,
        )
        if claim.verdict is not _OWNED:
            result, _ = self._stages_5_to_8(checked_call, call, call_id, policy, trace, state)
            return result

        try:
            if claim.previous is _KEY_UNKNOWN:
                # The effect may already have happened: finish it under the same key rather than
                # judge it again against a state that it may itself have changed.
                result, status = self._execute(spec, arguments, call, call_id, key)
            else:
                result, status = self._stages_5_to_8(
                    checked_call, call, call_id, policy, trace, state
                )
        except BaseException:
            may_have_happened = spec.writes and (trace.executing or claim.previous is _KEY_UNKNOWN)
            state.settle(Settlement(key, _KEY_UNKNOWN if may_have_happened else _KEY_OPEN))
            raise
        if status is not _KEY_HELD:
            stored = result.as_dict() if status is _KEY_COMPLETED else None
            # Written with the audit record, in the same request to the store.
            trace.settlement = Settlement(key, status, stored)
        return result

    def _allowance_ahead(
        self, spec: ToolSpec[Any], arguments: BaseModel, call: ToolCall, policy: Policy, key: str
    ) -> AllowanceRequest | None:
        """The money request stage 7 makes, made before the opening where the tool's money is
        its arguments' (a store may lock and read its history with the opening)."""
        money = spec.money_ahead(arguments) if spec.writes else None
        if money is None:
            return None
        now = self.clock()
        expires_at = now + timedelta(seconds=policy.confirmation_ttl_seconds)
        return _allowance_request(call, spec, key, money, policy, now, self.new_id(), expires_at)

    def _stages_1_to_3(self, call: ToolCall, policy: Policy, call_id: str) -> _Checked | CallResult:
        # 1. Known tool, and on this agent's allowlist.
        spec = allowed_tool(self.registry, policy, call.tool)
        if isinstance(spec, Refusal):
            return _rejected(call, call_id, spec.code, spec.message)

        # 2. One strict JSON object within the size limit.
        try:
            if isinstance(call.arguments, str):
                document = loads_object(call.arguments, max_bytes=self.limits.max_argument_bytes)
            else:
                document = check_object(call.arguments, max_bytes=self.limits.max_argument_bytes)
        except StrictJSONError as exc:
            return _rejected(
                call,
                call_id,
                codes.INVALID_JSON,
                f"arguments: {exc} (send exactly one JSON object with the fields: "
                f"{', '.join(spec.arguments.model_fields)})",
            )

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
        return spec, arguments, validated, canonical, key

    def _stages_5_to_8(
        self,
        checked: _CheckedCall,
        call: ToolCall,
        call_id: str,
        policy: Policy,
        trace: _Trace,
        state: StatePort,
    ) -> Execution:
        spec, arguments, validated, canonical, read_ahead, ahead = checked
        # 5 and 6. Business rules against the live state, then the agent's policy limits.
        judged = rules_refusal(spec, arguments, call.customer_id, policy, read_ahead)
        if isinstance(judged, Refusal):
            return _answered(spec, call_id, _KEY_OPEN, judged.code, judged.message, judged.data)
        money = judged

        # 7. A human decides where the policy says so: for the tool always, or by its money
        # (the customer's sum, dispatch/pipeline/allowance.py); only calls that would succeed
        # get here. Money moved without a human is reserved too, so that it counts in the sum.
        key = trace.key or ""
        reserved = False
        rule = policy.human_rule(spec.name, high_risk=spec.risk is _HIGH_RISK)
        if money is not None or rule is not _NEVER:
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
            if hold is not None:
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
                    reviewers_required=policy.reviewers_required(
                        total, money.currency if money else ""
                    ),
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
                return self._held(call_id, confirmation, replayed=False), _KEY_HELD
            reserved = money is not None

        # 8. Execution. What was read ahead is the first read of the tool's check, if it has one.
        trace.executing = True
        result, status = self._execute(
            spec, arguments, call, call_id, key, read_ahead=None if spec.check else read_ahead
        )
        if reserved and status is _KEY_OPEN:
            # Nothing moved (refused, or not applied): the money it reserved is free again.
            state.release_allowance(key)
        return result, status

    def _execute(
        self,
        spec: ToolSpec[Any],
        arguments: BaseModel,
        call: ToolCall,
        call_id: str,
        key: str,
        approved_by: tuple[str, ...] = (),
        read_ahead: ReadAhead | None = None,
    ) -> Execution:
        return execute_with_retries(
            spec,
            arguments,
            ExecutionContext(call.customer_id, key, approved_by, read_ahead, call.agent_id),
            call_id=call_id,
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

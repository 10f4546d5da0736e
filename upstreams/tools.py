"""An upstream's tools, declared in the same shape as a hosted tool's (dispatch.pipeline.tools).

A declarations module writes ToolSpecs whose checks, reviews, handlers and outcome reads call
the upstream (upstreams.http.Upstream); `upstream_tools` makes them the upstream's: every
writing tool remote (its key and reservation committed before the upstream is called), every
failure of the upstream one of the pipeline's answers, and the start-up rules enforced:

- a writing tool on an upstream that does not honour Idempotency-Key declares `outcome_of`, the
  read that finds the effect made under a key (or, as an UpstreamWrite, `effect_of`, which finds
  it by the call's arguments); its handler then asks that read before it sends, so that a call
  sent again (a retry, a lost answer, a lease taken over) finds its first effect;
- a writing tool's outcome read (by key, or by arguments) is declared wherever it exists, for
  the reconciliation; and its lease, the longest its effect may take on this upstream.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from dispatch.pipeline.codes import Code
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    OutcomeUnknownError,
    Refused,
    Rejection,
    ToolSpec,
    TransientError,
)
from upstreams.http import UpstreamBadAnswer, UpstreamChanged, UpstreamFault, UpstreamRefusal

logger = logging.getLogger(__name__)

UPSTREAM_REFUSED = Code(
    "UPSTREAM_REFUSED",
    8,
    "The upstream refused the call after Toolgate's checks passed; `message` gives its reason "
    "(escaped). Nothing was done, and its money no longer counts.",
    True,
    False,
)
UPSTREAM_BAD_ANSWER = Code(
    "UPSTREAM_BAD_ANSWER",
    8,
    "The upstream answered something that is not its declared answer; nothing of it is shown.",
    False,
    False,
)
UPSTREAM_READ_FAILED = Code(
    "UPSTREAM_READ_FAILED",
    5,
    "A business check could not read the upstream's live state; nothing was done, and the same "
    "call may pass shortly.",
    False,
    True,
)
UPSTREAM_CHANGED = Code(
    "UPSTREAM_CHANGED",
    8,
    "The upstream no longer offers this tool as it was reviewed (removed, or its arguments "
    "described differently); nothing was sent to it, and its money no longer counts. It stays "
    "refused until an administrator reviews the change.",
    False,
    False,
)
UPSTREAM_CODES = (UPSTREAM_REFUSED, UPSTREAM_BAD_ANSWER, UPSTREAM_READ_FAILED, UPSTREAM_CHANGED)
# The attempts of one write (the pipeline's RetryPolicy), and an upstream's time budget where its
# declaration gives none: what a write's lease is made of.
WRITE_ATTEMPTS = 3
DEFAULT_TIMEOUT_SECONDS = 10.0


class Connected(Protocol):
    """An upstream as its tools are wrapped: its name, and whether it honours the key."""

    @property
    def name(self) -> str: ...

    @property
    def honours_idempotency_key(self) -> bool: ...


# What a write's effect under this call was, read from the upstream with the call's arguments and
# context (its key, its customer), or None if there was none.
EffectOf = Callable[[Any, ExecutionContext], Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class UpstreamWrite:
    """A writing tool whose effect is found by its arguments rather than by its key alone (an
    upstream that stores no key of Toolgate's: a cancelled order is this call's cancellation, its
    check having found the order pending). Every attempt reads it before it sends; a call left
    unknown, or in progress by a process that died, is settled by the same read: from the same
    call sent again, `settle_outcomes` or the reconciliation page (the call's arguments are kept
    with its key)."""

    spec: ToolSpec[Any]
    effect_of: EffectOf


class UpstreamDeclarationError(Exception):
    """A declaration that must not start: Toolgate refuses to serve it."""


def upstream_tools(
    upstream: Connected, declared: Iterable[ToolSpec[Any] | UpstreamWrite]
) -> tuple[ToolSpec[Any], ...]:
    """The declared tools as the pipeline runs them; raises UpstreamDeclarationError for one
    that breaks a start-up rule."""
    made = []
    for tool in declared:
        spec = tool.spec if isinstance(tool, UpstreamWrite) else tool
        effect_of = tool.effect_of if isinstance(tool, UpstreamWrite) else _by_key(spec)
        if spec.writes and effect_of is None and not upstream.honours_idempotency_key:
            raise UpstreamDeclarationError(
                f"{spec.name} writes to {upstream.name}, which does not honour Idempotency-Key, "
                "and declares no outcome_of: nothing could tell whether its effect happened"
            )
        made.append(
            dataclasses.replace(
                spec,
                check=None if spec.check is None else _checked(upstream, spec.check),
                handler=_handled(upstream, spec, effect_of),
                outcome_of=None if spec.outcome_of is None else _outcome(spec.outcome_of),
                effect_of=(
                    _effect(tool.effect_of) if isinstance(tool, UpstreamWrite) else spec.effect_of
                ),
                codes=tuple(dict.fromkeys((*spec.codes, *UPSTREAM_CODES))),
                remote=spec.writes,
                lease_seconds=lease_seconds(upstream),
            )
        )
    return tuple(made)


def _by_key(spec: ToolSpec[Any]) -> EffectOf | None:
    """A write's effect read by its key alone (its outcome_of), if it declares one."""
    outcome_of = spec.outcome_of
    if outcome_of is None:
        return None

    def effect_by_key(arguments: Any, context: ExecutionContext) -> Mapping[str, Any] | None:
        return outcome_of(context.idempotency_key)

    return effect_by_key


def _checked(
    upstream: Connected, check: Callable[[Any, CheckContext], Rejection | None]
) -> Callable[[Any, CheckContext], Rejection | None]:
    def upstream_check(arguments: Any, context: CheckContext) -> Rejection | None:
        try:
            return check(arguments, context)
        except UpstreamRefusal as refusal:
            return _refusal(refusal)
        except UpstreamChanged as changed:
            return _changed(changed)
        except UpstreamFault as fault:
            return Rejection(
                UPSTREAM_READ_FAILED,
                f"The live state could not be read from {upstream.name} ({fault.words}); "
                "nothing was done. The same call may pass shortly.",
                {"upstream": upstream.name},
            )

    return upstream_check


def _handled(
    upstream: Connected, spec: ToolSpec[Any], effect_of: EffectOf | None
) -> Callable[[Any, ExecutionContext], Mapping[str, Any]]:
    handler = spec.handler
    reads_first = spec.writes and not upstream.honours_idempotency_key

    def upstream_handler(arguments: Any, context: ExecutionContext) -> Mapping[str, Any]:
        try:
            if reads_first and effect_of is not None:
                # Toolgate's key is the dedupe: an effect already made under it is its answer.
                made = effect_of(arguments, context)
                if made is not None:
                    return made
            return handler(arguments, context)
        except UpstreamRefusal as refusal:
            raise Refused(_refusal(refusal)) from None
        except UpstreamChanged as changed:
            raise Refused(_changed(changed)) from None
        except UpstreamBadAnswer as fault:
            if spec.writes:
                # It answered with success, unreadably: the effect may be made.
                raise OutcomeUnknownError(str(fault)) from None
            raise Refused(
                Rejection(
                    UPSTREAM_BAD_ANSWER,
                    f"{upstream.name} answered {spec.name} with something that is not its "
                    f"declared answer ({fault.words}); nothing of it is shown.",
                )
            ) from None
        except UpstreamFault as fault:
            if spec.writes and fault.may_have_happened:
                raise OutcomeUnknownError(str(fault)) from None
            raise TransientError(str(fault)) from None

    return upstream_handler


def _outcome(
    outcome_of: Callable[[str], Mapping[str, Any] | None],
) -> Callable[[str], Mapping[str, Any] | None]:
    def upstream_outcome(key: str) -> Mapping[str, Any] | None:
        # A failure to read is no answer: the caller keeps the outcome unknown.
        try:
            return outcome_of(key)
        except UpstreamFault as fault:
            raise OutcomeUnknownError(str(fault)) from None

    return upstream_outcome


def _effect(effect_of: EffectOf) -> EffectOf:
    def upstream_effect(arguments: Any, context: ExecutionContext) -> Mapping[str, Any] | None:
        try:
            return effect_of(arguments, context)
        except UpstreamFault as fault:
            raise OutcomeUnknownError(str(fault)) from None

    return upstream_effect


def lease_seconds(upstream: Connected) -> float:
    """How long a write's effect on the upstream may take: every attempt (RetryPolicy's) given
    its time budget to connect and then to answer, and a second to spare."""
    declared = getattr(upstream, "declared", None)
    seconds = float(getattr(declared, "timeout_seconds", DEFAULT_TIMEOUT_SECONDS))
    return WRITE_ATTEMPTS * 2 * seconds + 1.0


def _refusal(refusal: UpstreamRefusal) -> Rejection:
    status = f" (HTTP {refusal.status})" if refusal.status else ""
    return Rejection(
        UPSTREAM_REFUSED,
        f"{refusal.upstream} refused it{status}: {refusal.words}",
        {"upstream": refusal.upstream, "status": refusal.status},
    )


def _changed(changed: UpstreamChanged) -> Rejection:
    return Rejection(
        UPSTREAM_CHANGED,
        f"{changed.upstream} no longer offers this tool as it was reviewed ({changed.words}); "
        "nothing was sent to it. Do not retry: tell the user it is unavailable for now.",
        {"upstream": changed.upstream},
    )


def answer_data(answer: BaseModel) -> dict[str, Any]:
    """An upstream's answer as a tool's result data."""
    return answer.model_dump(mode="json")

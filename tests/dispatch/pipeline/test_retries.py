"""Stage 8's retries (execute_with_retries): what a write's attempts leave its key as."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from dispatch.pipeline import codes
from dispatch.pipeline.engine import RetryPolicy, execute_with_retries
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import (
    ExecutionContext,
    OutcomeUnknownError,
    Refused,
    Rejection,
    ToolSpec,
    TransientError,
)


class Arguments(BaseModel):
    payment_id: str


REFUSAL = Rejection(codes.Code("UPSTREAM_CHANGED", 8, "changed", False, False), "changed")


def run(*attempts: Exception | None, writes: bool = True) -> tuple[str, KeyStatus, int]:
    """Each attempt raises its exception, or succeeds for None; the code, the key's status and
    the attempts made."""
    made = iter(attempts)
    count = 0

    def handler(arguments: Any, context: ExecutionContext) -> Mapping[str, Any]:
        nonlocal count
        count += 1
        error = next(made)
        if error is not None:
            raise error
        return {"refund_id": "R-1"}

    spec = ToolSpec(
        name="refund_payment", description="", arguments=Arguments, handler=handler, writes=writes
    )
    result, status = execute_with_retries(
        spec,
        Arguments(payment_id="PAY-1"),
        ExecutionContext("CUS-1", "key-1"),
        call_id="call-1",
        retry=RetryPolicy(attempts=3),
        sleep=lambda seconds: None,
    )
    return result.code, status, count


def test_a_refusal_at_the_first_attempt_leaves_the_key_open() -> None:
    assert run(Refused(REFUSAL)) == ("UPSTREAM_CHANGED", KeyStatus.OPEN, 1)


def test_a_refusal_after_an_attempt_that_may_have_taken_effect_leaves_the_outcome_unknown() -> None:
    code, status, count = run(OutcomeUnknownError("no answer"), Refused(REFUSAL))

    assert (code, status, count) == (codes.UPSTREAM_UNAVAILABLE.name, KeyStatus.UNKNOWN, 2)


def test_a_refusal_after_attempts_that_surely_did_nothing_leaves_the_key_open() -> None:
    assert run(TransientError("down"), Refused(REFUSAL)) == ("UPSTREAM_CHANGED", KeyStatus.OPEN, 2)


def test_a_success_after_an_uncertain_attempt_completes() -> None:
    assert run(OutcomeUnknownError("no answer"), None) == ("OK", KeyStatus.COMPLETED, 2)

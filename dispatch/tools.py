"""The tools dispatch itself offers, declared and registered like a domain's: a held call's status.

A model whose refund was held (CONFIRMATION_REQUIRED) can ask later what became of it. It sees
only the confirmations of its own agent and customer; any other id is answered like one that does
not exist. While the held call waits for a human, asking counts toward neither the session's step
budget nor the repeat limit (ToolSpec.watches); once decided, the answer is its outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dispatch import selectors
from dispatch.pipeline.codes import Code
from dispatch.pipeline.tools import ExecutionContext, Refused, Rejection, ToolSpec

CONFIRMATION_NOT_FOUND = Code(
    "CONFIRMATION_NOT_FOUND",
    5,
    "No confirmation with that id exists for this agent and customer; use the id that a held "
    "call answered with.",
    True,
    False,
)


class GetConfirmationStatusArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="get_confirmation_status")

    confirmation_id: str = Field(
        pattern=r"^[0-9a-f]{32}$",
        description="the confirmation_id that a held call answered with (CONFIRMATION_REQUIRED): "
        "32 lowercase hexadecimal digits",
    )


def get_confirmation_status(
    arguments: GetConfirmationStatusArguments, context: ExecutionContext
) -> Mapping[str, Any]:
    confirmation = selectors.confirmation_for_customer(
        agent_id=context.agent_id,
        customer_id=context.customer_id,
        confirmation_id=arguments.confirmation_id,
    )
    if confirmation is None:
        raise Refused(
            Rejection(
                CONFIRMATION_NOT_FOUND,
                f"confirmation_id: no confirmation {arguments.confirmation_id} exists for this "
                "customer (use the confirmation_id that the held call answered with)",
            )
        )
    return selectors.confirmation_state(confirmation)


def dispatch_tools() -> tuple[ToolSpec[Any], ...]:
    return (
        ToolSpec(
            name="get_confirmation_status",
            label="Get confirmation status",
            description="Check what became of a call that was held for human approval: pending, "
            "approved, executed (with its result), rejected (with the reviewer's reason), "
            "expired or invalidated. Read-only.",
            arguments=GetConfirmationStatusArguments,
            handler=get_confirmation_status,
            idempotent=True,
            codes=(CONFIRMATION_NOT_FOUND,),
            # Asking while the call waits for a human costs the session nothing.
            watches="confirmation_id",
        ),
    )

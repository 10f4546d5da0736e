"""The API's request and response shapes, validated strictly and documented from one place."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.results import CallResult

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
CUSTOMER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
# What the agent host vouches for, rather than the model: kept as sent, so text that no database
# stores in them is refused with the envelope.
HOST_FIELDS = ("session_id", "customer_id", "context")


# Text without NUL, which no database stores (the API refuses it with a 400 naming the field).
NO_NUL = {"type": "string", "pattern": "^[^\\u0000]*$"}


class CallEnvelope(BaseModel):
    """POST /api/v1/calls: one raw tool call as the model produced it."""

    model_config = ConfigDict(extra="forbid", strict=True, title="CallRequest")

    session_id: str = Field(
        pattern=SESSION_ID_PATTERN,
        description="the agent host's conversation id (ASCII letters, digits, . _ : -)",
    )
    customer_id: str = Field(
        pattern=CUSTOMER_ID_PATTERN,
        description="the customer the agent host authenticated; the session is bound to it",
    )
    tool: str = Field(min_length=1, max_length=128, description="the tool name the model chose")
    # Any JSON value: what the model produced is judged by the pipeline, not refused here. Other
    # than a string or an object it is a 200 whose code is INVALID_JSON, recorded and told to the
    # model, which can correct it.
    arguments: Any = Field(
        description="the model's raw argument text (a string) or a JSON object; any other JSON "
        "value is answered 200 with the code INVALID_JSON, which the model can correct",
    )
    context: str = Field(
        default="",
        max_length=2000,
        description="optional: what a reviewer should see if the call is held (the customer's own "
        "words, or the agent's summary); shown escaped, never interpreted",
        json_schema_extra={"pattern": NO_NUL["pattern"]},
    )


class CallResultDoc(BaseModel):
    """The result contract (documentation of dispatch.pipeline.results.CallResult)."""

    model_config = ConfigDict(title="CallResult")

    call_id: str
    ok: bool
    tool: str
    code: str = Field(description="stable result code; see GET /api/v1/codes")
    message: str = Field(description="for the model: the field, the problem and the fix")
    data: dict[str, Any]
    replayed: bool = Field(description="an identical earlier call's result, not executed again")
    retryable: bool = Field(description="whether sending the same call again can help")
    model_text: str = Field(description="compact text to hand back to the model")


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str
    retryable: bool = Field(description="whether sending the same request again can help")
    error_id: str | None = Field(
        default=None, description="on a 500 only: the id under which the error is logged"
    )


class ErrorEnvelope(BaseModel):
    """Every answer of the API that is not a result: 4xx, and 500 or 503."""

    model_config = ConfigDict(title="Error")

    error: ErrorBody


class CodeDoc(BaseModel):
    code: str
    stage: int
    meaning: str
    model_fixable: bool
    retryable: bool


class CodeCatalogueDoc(BaseModel):
    model_config = ConfigDict(title="CodeCatalogue")

    codes: list[CodeDoc]


class ToolListDoc(BaseModel):
    model_config = ConfigDict(title="ToolList")

    format: str = Field(description="neutral, openai or anthropic, as asked")
    tools: list[dict[str, Any]] = Field(description="the tools this agent may call, in that format")


class ConfirmationDoc(BaseModel):
    model_config = ConfigDict(title="Confirmation")

    confirmation_id: str
    status: str = Field(
        description="pending, approved, executing, executed, failed, unknown, rejected, expired, "
        "invalidated or superseded (a reviewer edited it: follow superseded_by)"
    )
    final: bool = Field(
        description="true once nothing follows (executed, failed, unknown, rejected, expired, "
        "invalidated or superseded): stop polling"
    )
    tool: str
    summary: str = Field(
        description="the call in its tool's own words, for a person: its label, then the amount "
        "(in minor units) and what it is for"
    )
    arguments: dict[str, Any]
    reviewers_required: int
    policy_version: int
    created_at: str
    expires_at: str
    decided_at: str | None
    hold_reason: dict[str, Any] | None = Field(description="why the policy held it")
    decision_code: str | None = Field(description="why it was rejected, invalidated or expired")
    decision_reason: str | None = Field(description="the reviewer's or the re-check's words")
    finished_at: str | None = Field(description="when its execution ended")
    result: dict[str, Any] | None = Field(
        description="the final result contract, with model_text, once final"
    )
    edited_from: dict[str, Any] | None = Field(
        default=None,
        description="a reviewer's edit: the held call it was made from (its confirmation_id and "
        "the arguments the model asked)",
    )
    superseded_by: str | None = Field(
        default=None,
        description="the confirmation a reviewer edited this one into, which executes instead",
    )


class SessionCallDoc(BaseModel):
    call_id: str
    at: str
    step: int | None
    tool: str
    ok: bool
    code: str
    message: str
    replayed: bool
    arguments: dict[str, Any] | None
    confirmation_id: str | None
    duration_ms: float
    channel: Literal["api", "mcp"] = Field(description="how the call came in: the API, or MCP")


class SessionCallsDoc(BaseModel):
    model_config = ConfigDict(title="SessionCalls")

    session_id: str
    customer_id: str
    count: int
    next: str | None
    previous: str | None
    results: list[SessionCallDoc]


RESULT_FIELDS = tuple(f.name for f in fields(CallResult))

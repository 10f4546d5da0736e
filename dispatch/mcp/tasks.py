"""Held calls as MCP tasks (protocol 2025-11-25): a task-augmented `tools/call` (one whose
params carry `task`) is answered with a task instead of its result, and `tasks/get`,
`tasks/result` and `tasks/cancel` follow it.

A held call's task is its confirmation: the task id is the confirmation id, its status follows
the confirmation's (working while it waits or executes; completed once executed; failed once
rejected, expired, invalidated or failed, with its code; cancelled once the host withdrew it),
and `tasks/result` is the result the API gives for it. Nothing of it lives in the server's
memory: a task outlives the connection and the process. A task-augmented call answered at once
(executed, or refused) is kept as an AnsweredTask row for its ttl (the client's, at most
TOOLGATE_IDEMPOTENCY_KEEP_SECONDS), which the retention deletes after it.

A task is the agent's and the customer's, as a confirmation is: any other id, an unknown one,
a malformed one and one past its ttl are all answered with the same error.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import mcp.types as types
from django.conf import settings
from django.utils import timezone
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError

from dispatch import selectors
from dispatch.mcp.results import refusal_error
from dispatch.mcp.sessions import Host, HostOf, host_refusal, refusal_record
from dispatch.models import AnsweredTask, Confirmation, ConfirmationStatus
from dispatch.pipeline import codes
from dispatch.pipeline.decision import ALREADY_DECIDED
from dispatch.pipeline.results import CallResult
from dispatch.withdrawal import NOT_FOUND, DecisionRefused, held_call_withdraw

# The protocol revision whose core has tasks (2026-07-28 moved them to an extension).
TASKS_PROTOCOL_VERSION = "2025-11-25"
# Where a result names the task it is the outcome of.
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
# How often a client is asked to poll tasks/get, and how long tasks/result waits for a task to
# end before it answers that it is still working.
POLL_INTERVAL_MS = 5000
RESULT_WAIT_SECONDS = 25.0
_RESULT_POLL_SECONDS = 0.5
# Task ids: confirmation ids, and those of answered tasks (ANSWERED_PREFIX and 32 hex digits).
ANSWERED_PREFIX = "answered-"
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

# A confirmation's status as a task's.
_TASK_STATUS: Mapping[str, types.TaskStatus] = {
    ConfirmationStatus.PENDING: "working",
    ConfirmationStatus.APPROVED: "working",
    ConfirmationStatus.EXECUTING: "working",
    # Until a reviewer reconciles it with the system of record.
    ConfirmationStatus.UNKNOWN: "working",
    ConfirmationStatus.EXECUTED: "completed",
    ConfirmationStatus.FAILED: "failed",
    ConfirmationStatus.REJECTED: "failed",
    ConfirmationStatus.EXPIRED: "failed",
    ConfirmationStatus.INVALIDATED: "failed",
    ConfirmationStatus.WITHDRAWN: "cancelled",
}
_TERMINAL = frozenset({"completed", "failed", "cancelled"})

NO_SUCH_TASK = (
    "No task with that id exists for this agent and customer (an answered task is kept for its "
    "ttl); use the taskId that the task-augmented tools/call answered with."
)


def task_capability() -> types.ServerTasksCapability:
    """What the server declares: task-augmented tools/call, and tasks/cancel (no tasks/list)."""
    return types.ServerTasksCapability(
        cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(
            tools=types.TasksToolsCapability(call=types.TasksCallCapability())
        ),
    )


def task_requested(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether a request is a task-augmented tools/call of the revision that has tasks."""
    params = ctx.params
    return (
        ctx.method == "tools/call"
        and ctx.protocol_version == TASKS_PROTOCOL_VERSION
        and isinstance(params, Mapping)
        and isinstance(params.get("task"), Mapping)
    )


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _confirmation_task(confirmation: Confirmation, task_id: str | None = None) -> types.Task:
    state = selectors.confirmation_state(confirmation)
    status = _TASK_STATUS[state["status"]]
    if status == "working":
        message = f"{state['summary']}: {state['status']}, waiting for a human."
    else:
        message = state["decision_reason"] or state["status"]
    updated = confirmation.finished_at or confirmation.decided_at or confirmation.created_at
    if state["status"] == ConfirmationStatus.EXPIRED and confirmation.decided_at is None:
        updated = confirmation.expires_at
    return types.Task(
        task_id=task_id or confirmation.pk,
        status=status,
        status_message=message,
        created_at=_iso(confirmation.created_at),
        last_updated_at=_iso(updated),
        # Kept as long as its confirmation is.
        ttl=None,
        poll_interval=POLL_INTERVAL_MS if status == "working" else None,
    )


def _answered_task(answered: AnsweredTask) -> types.Task:
    ttl = answered.expires_at - answered.created_at
    return types.Task(
        task_id=answered.pk,
        status="completed" if answered.ok else "failed",
        status_message=str(answered.result.get("structuredContent", {}).get("code", "")) or None,
        created_at=_iso(answered.created_at),
        last_updated_at=_iso(answered.created_at),
        ttl=int(ttl.total_seconds() * 1000),
    )


def _wire(task: types.Task) -> dict[str, Any]:
    return task.model_dump(mode="json", by_alias=True, exclude_none=False)


def task_created(
    host: Host, answer: Mapping[str, Any], requested_ttl: int | None
) -> dict[str, Any]:
    """The CreateTaskResult for a task-augmented tools/call that the pipeline answered with
    `answer` (its CallToolResult, as the wire has it): the held call's confirmation as a task,
    or a task kept for its ttl with the answer given at once."""
    if host_refusal(host) is not None or host.agent is None or not host.customer_id:
        # Refused on the host's side (no agent, no valid customer or session): no one could
        # read a task; the refusal is the answer.
        return dict(answer)
    contract = answer.get("structuredContent") or {}
    held = contract.get("code") == codes.CONFIRMATION_REQUIRED.name
    confirmation_id = (contract.get("data") or {}).get("confirmation_id")
    if held and confirmation_id:
        confirmation = selectors.confirmation_for_customer(
            agent_id=str(host.agent.pk),
            customer_id=host.customer_id,
            confirmation_id=str(confirmation_id),
        )
        if confirmation is not None:
            return {"task": _wire(_confirmation_task(confirmation))}
    keep_ms = settings.TOOLGATE_IDEMPOTENCY_KEEP_SECONDS * 1000
    ttl = keep_ms if requested_ttl is None else max(0, min(requested_ttl, keep_ms))
    now = timezone.now()
    answered = AnsweredTask.objects.create(
        id=f"{ANSWERED_PREFIX}{secrets.token_hex(16)}",
        agent=host.agent,
        customer_id=host.customer_id,
        tool=str(contract.get("tool", "")),
        result=dict(answer),
        ok=not answer.get("isError", False),
        created_at=now,
        expires_at=now + timedelta(milliseconds=ttl),
    )
    return {"task": _wire(_answered_task(answered))}


# Reading a task, as the host's agent and customer -------------------------------------------------


def _found(host: Host, task_id: str) -> Confirmation | AnsweredTask | None:
    if host.agent is None or not host.customer_id or not _TASK_ID.fullmatch(task_id):
        return None
    if task_id.startswith(ANSWERED_PREFIX):
        return AnsweredTask.objects.filter(
            pk=task_id,
            agent=host.agent,
            customer_id=host.customer_id,
            expires_at__gt=timezone.now(),
        ).first()
    found = selectors.confirmation_for_customer(
        agent_id=str(host.agent.pk), customer_id=host.customer_id, confirmation_id=task_id
    )
    # A reviewer's edit put another call in the held call's place: the task follows it, under
    # the id the client knows.
    while found is not None and found.status == ConfirmationStatus.SUPERSEDED:
        found = Confirmation.objects.filter(edited_from=found.pk).first()
    return found


def _task(found: Confirmation | AnsweredTask, task_id: str) -> types.Task:
    if isinstance(found, AnsweredTask):
        return _answered_task(found)
    return _confirmation_task(found, task_id)


def _not_found() -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message=NO_SUCH_TASK)


def _host_checked(host: Host) -> None:
    refusal = host_refusal(host)
    if refusal is not None:
        refusal_record(host, refusal)
        error = refusal_error(refusal.status, refusal.reason, refusal.message)
        raise MCPError.from_error_data(error)


def task_get(host: Host, task_id: str) -> dict[str, Any]:
    _host_checked(host)
    found = _found(host, task_id)
    if found is None:
        raise _not_found()
    return _wire(_task(found, task_id))


def _confirmation_result(confirmation: Confirmation) -> dict[str, Any]:
    """The CallToolResult of a held call that ended: its result contract as the API gives it,
    or, where the decision left none (expired, withdrawn), one made of its decision's code and
    words."""
    state = selectors.confirmation_state(confirmation)
    stored = state["result"]
    if stored is not None:
        contract = dict(stored)
    else:
        code = state["decision_code"] or str(state["status"]).upper()
        message = state["decision_reason"] or f"The held call is {state['status']}."
        contract = CallResult(
            call_id=confirmation.pk,
            ok=False,
            tool=confirmation.tool,
            code=code,
            message=message,
            data={"confirmation_id": confirmation.pk, "status": state["status"]},
            model_text=f"Toolgate: {confirmation.tool} (confirmation {confirmation.pk}): "
            f"{message} Nothing was done.",
        ).as_dict()
    return {
        "content": [{"type": "text", "text": contract.get("model_text") or contract["message"]}],
        "structuredContent": contract,
        "isError": not contract.get("ok", False),
    }


def task_result(host: Host, task_id: str, wait_seconds: float = RESULT_WAIT_SECONDS) -> Any:
    """The task's result once it ended (blocking up to `wait_seconds` while it works), with the
    related-task metadata."""
    _host_checked(host)
    deadline = time.monotonic() + wait_seconds
    while True:
        found = _found(host, task_id)
        if found is None:
            raise _not_found()
        task = _task(found, task_id)
        if task.status in _TERMINAL:
            break
        if time.monotonic() >= deadline:
            raise MCPError(
                code=types.INVALID_REQUEST,
                message=(
                    f"Task {task_id} is still {task.status} (waiting for a human); poll tasks/get "
                    "and ask for its result once it is completed, failed or cancelled."
                ),
            )
        time.sleep(_RESULT_POLL_SECONDS)
    if isinstance(found, AnsweredTask):
        result: dict[str, Any] = dict(found.result)
    else:
        result = _confirmation_result(found)
    meta = dict(result.get("_meta") or {})
    meta[RELATED_TASK_META] = {"taskId": task_id}
    return {**result, "_meta": meta}


def task_cancel(host: Host, task_id: str) -> dict[str, Any]:
    """Withdraw the held call of a working task (dispatch.withdrawal):
    refused once a reviewer approved it, and for a task that already ended."""
    _host_checked(host)
    found = _found(host, task_id)
    if found is None:
        raise _not_found()
    if isinstance(found, AnsweredTask):
        raise MCPError(
            code=types.INVALID_PARAMS,
            message=f"Cannot cancel task {task_id}: it is already {_task(found, task_id).status}.",
            data={"code": ALREADY_DECIDED},
        )
    assert host.agent is not None
    try:
        withdrawn = held_call_withdraw(
            confirmation_id=found.pk, agent=host.agent, customer_id=host.customer_id
        )
    except DecisionRefused as refused:
        if refused.code == NOT_FOUND:
            raise _not_found() from None
        raise MCPError(
            code=types.INVALID_PARAMS,
            message=f"Cannot cancel task {task_id}: {refused.message}",
            data={"code": refused.code},
        ) from None
    return _wire(_confirmation_task(withdrawn, task_id))


# The server's side ----------------------------------------------------------------------------


def tasks_install(server: Any, host_of: HostOf, in_django: Any) -> None:
    """Serve tasks on `server`: the middleware that answers a task-augmented tools/call with a
    task, and the tasks/* methods."""

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if not task_requested(ctx):
            return await call_next(ctx)
        # The call runs as any tools/call does (validated, judged, recorded); only its answer
        # is given as a task.
        answer: Any = await call_next(ctx)
        assert isinstance(answer, dict)
        requested = ctx.params["task"].get("ttl") if ctx.params else None
        ttl = requested if isinstance(requested, int) else None
        created: dict[str, Any] = await in_django(lambda: task_created(host_of(ctx), answer, ttl))
        return created

    async def get(ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams) -> Any:
        return await in_django(lambda: task_get(host_of(ctx), params.task_id))

    async def result(
        ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
    ) -> Any:
        return await in_django(lambda: task_result(host_of(ctx), params.task_id))

    async def cancel(
        ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> Any:
        return await in_django(lambda: task_cancel(host_of(ctx), params.task_id))

    server.middleware.append(middleware)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, result)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, cancel)

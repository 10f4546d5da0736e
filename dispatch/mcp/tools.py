"""The agent's tools as MCP serves them: `tools/list` lists the agent's allowed tools from their
declarations in the registry, with their input schemas, the result contract as their output
schema, their annotations and the server's instructions; every `tools/call` is `call_dispatch`,
so it gets the same step budget, idempotency, business rules, policy, confirmation and audit
record as `POST /api/v1/calls`. The server both transports run is built here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, TypeVar

import anyio
import mcp.types as types
from django.db import InterfaceError, OperationalError, connections
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from dispatch import selectors
from dispatch.mcp.messages import same_arguments
from dispatch.mcp.results import DATABASE_UNAVAILABLE, call_result, refusal_result, result_schema
from dispatch.mcp.sessions import (
    SESSION_CONFLICT,
    Host,
    HostOf,
    agent_refusal,
    host_refusal,
    named_by_call,
    refusal_record,
    refused,
)
from dispatch.mcp.tasks import task_capability, tasks_install
from dispatch.models import Agent, CallChannel
from dispatch.pipeline.state import SessionConflict, StoreUnavailable
from dispatch.pipeline.tools import ToolSpec, held_plurals
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch

SERVER_NAME = "toolgate"

# A tools/call's arguments as the door read them (strict JSON), or None if it has none for it.
ArgumentsOf = Callable[[ServerRequestContext[Any, Any]], Mapping[str, Any] | None]

_T = TypeVar("_T")


def tool_annotations(spec: ToolSpec[Any]) -> types.ToolAnnotations:
    return types.ToolAnnotations(
        title=spec.label or spec.name,
        read_only_hint=not spec.writes,
        destructive_hint=spec.destructive,
        idempotent_hint=spec.idempotent,
    )


def tools_listed(agent: Agent) -> list[types.Tool]:
    """The agent's allowed tools, from the same declarations as GET /api/v1/tools."""
    return [
        types.Tool(
            name=spec.name,
            title=spec.label or None,
            description=spec.description,
            input_schema=spec.json_schema(),
            output_schema=result_schema(),
            annotations=tool_annotations(spec),
            # A held call may be followed as a task (dispatch.mcp.tasks), by a client that asks.
            execution=types.ToolExecution(task_support="optional"),
        )
        for spec in selectors.tools_for_agent(agent)
    ]


def server_instructions() -> str:
    """What a client is told once: what is held for a human, in the declared tools' words."""
    return (
        "Toolgate checks every tool call before anything happens. Amounts are integers in minor "
        f"units; {held_plurals(tool_registry)} may be held for a human (CONFIRMATION_REQUIRED): "
        "tell the user, and check later with get_confirmation_status where you have that tool "
        "(asking while the call waits costs nothing)."
    )


def tool_call(host: Host, name: str, arguments: Mapping[str, Any] | None) -> types.CallToolResult:
    """One tools/call through the pipeline, as the host's agent, session and customer."""
    refusal = host_refusal(host)
    if refusal is not None:
        return refused(host, name, refusal)
    assert host.agent is not None and host.session_id and host.customer_id
    try:
        result = call_dispatch(
            agent=host.agent,
            session_id=host.session_id,
            customer_id=host.customer_id,
            tool=name,
            arguments=arguments or {},
            channel=CallChannel.MCP,
        )
    except SessionConflict:
        return refused(host, name, SESSION_CONFLICT)
    except (StoreUnavailable, OperationalError, InterfaceError):
        # Nothing ran and nothing was kept (the pipeline's store, or the connection the call
        # opens its transaction on); no event is written to a database that is away.
        return refusal_result(name, DATABASE_UNAVAILABLE)
    return call_result(result)


async def in_django(work: Callable[[], _T]) -> _T:
    """Run ORM work in a worker thread, and close that thread's connections after it."""

    def run() -> _T:
        try:
            return work()
        finally:
            connections.close_all()

    return await anyio.to_thread.run_sync(run)


def _version() -> str:
    try:
        return metadata.version("toolgate")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a tree not installed
        return ""


def mcp_server(host_of: HostOf, arguments_of: ArgumentsOf) -> Server[Any]:
    """The MCP server; `host_of` says who the host is for a request (called in a worker thread,
    where it may read the database), `arguments_of` what its tools/call's arguments are."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        def listed() -> list[types.Tool]:
            host = host_of(ctx)
            refusal = agent_refusal(host.agent)
            if refusal is not None:
                refusal_record(host, refusal)
                return []
            assert host.agent is not None
            return tools_listed(host.agent)

        return types.ListToolsResult(tools=await in_django(listed))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        # The arguments as the door read them, as the API reads its own: the SDK's reading of
        # the same message has the same keys and values (the door refused what is ambiguous)
        # but loses how a number was written (80.00, which the hint for minor units follows).
        read = arguments_of(ctx)
        same = read is not None and same_arguments(read, params.arguments)
        arguments = read if same else params.arguments
        meta = params.meta
        return await in_django(
            lambda: tool_call(named_by_call(host_of(ctx), meta), params.name, arguments)
        )

    server = _TasksServer(
        SERVER_NAME,
        version=_version(),
        instructions=server_instructions(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    tasks_install(server, host_of, in_django)
    return server


class _TasksServer(Server[Any]):
    """The SDK's server, declaring tasks (protocol 2025-11-25), which dispatch.mcp.tasks serves."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        return capabilities.model_copy(update={"tasks": task_capability()})

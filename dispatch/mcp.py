"""The MCP server: the agent's tools over the Model Context Protocol, with the pipeline inside.

A thin adapter, as the API is: `tools/list` lists the agent's allowed tools from their
declarations, and every `tools/call` is `call_dispatch`, so it gets the same step budget,
idempotency, business rules, policy, confirmation and audit record as `POST /api/v1/calls`.

What the model never chooses comes from the host: the agent (its token), the session and the
customer. Over stdio (`mcp_serve`) they are the process's: the token in TOOLGATE_TOKEN, the
session the host names (`--session`, TOOLGATE_SESSION) or else one of the process's own,
`--customer`. Over streamable HTTP they come with each request: `Authorization: Bearer <token>`
(or `Token`), the host's X-Toolgate-Session or else the MCP session, and X-Toolgate-Customer.
Protocol 2026-07-28 has no MCP session, so over HTTP it is offered only to a host that names its
conversations with X-Toolgate-Session; any other client is told so (-32022) and falls back to the
initialize handshake, whose Mcp-Session-Id is then the session.

Every tool's outputSchema is the result contract (dispatch.envelopes.CallResultDoc), and every
answer to a tools/call carries it as structured content, a refusal on the host's side too, with
a stable code (the API's own where it means the same).

The SDK parses each message before any handler sees it, and keeps the last of two keys where the
API refuses them; so each message is read first where its bytes are (StrictMessages over HTTP,
StrictLines over stdio) as the API reads a body (dispatch.doors), and refused there otherwise.
What is refused on the host's side is recorded as a security event (dispatch.security), as the
API records its own, with the channel `mcp`.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Any, BinaryIO, NamedTuple, Protocol, TypeVar, cast

import anyio
import mcp.types as types
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from rest_framework.exceptions import AuthenticationFailed
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatch import doors, selectors
from dispatch.auth_failures import THROTTLED_REASON
from dispatch.authentication import AgentTokenAuthentication, IsAgent, agent_throttle_wait
from dispatch.client_address import forwarded_client_address
from dispatch.envelopes import CUSTOMER_ID_PATTERN, SESSION_ID_PATTERN, CallResultDoc
from dispatch.errors import AuthenticationThrottled, RateLimiterDown, error_body
from dispatch.models import Agent, CallChannel
from dispatch.pipeline import codes
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.state import SessionConflict, StoreUnavailable
from dispatch.pipeline.tools import ToolSpec, held_plurals
from dispatch.registry import tool_registry
from dispatch.security import RECORDED_STATUSES, Origin, security_event_record
from dispatch.services import agent_authenticate, call_dispatch
from dispatch.throttling import RateLimiterUnavailable

SERVER_NAME = "toolgate"
TOKEN_VARIABLE = "TOOLGATE_TOKEN"
# Over stdio, the conversation the host starts this server for, as an option or in the environment.
SESSION_VARIABLE = "TOOLGATE_SESSION"
CUSTOMER_HEADER = "X-Toolgate-Customer"
SESSION_HEADER = "X-Toolgate-Session"
MCP_SESSION_HEADER = "Mcp-Session-Id"
HTTP_PATH = "/mcp"
# What a security event over stdio gives for its path: the process has no HTTP request.
STDIO_PATH = "stdio"
# Where the HTTP adapter leaves the agent that the request's token belongs to, and the arguments
# of the request's tools/call messages as it read them.
_AGENT_SCOPE_KEY = "toolgate.agent"
_ARGUMENTS_SCOPE_KEY = "toolgate.arguments"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Host:
    """What the agent host vouches for, for one request: never anything the model said; and
    where the request came in, which a refusal's security event keeps."""

    agent: Agent | None
    session_id: str | None
    customer_id: str | None
    origin: Origin


class HostRefusal(NamedTuple):
    """Why the host's side leaves no way to dispatch a call: the status the API would answer it
    with, its stable code (the API's own where it means the same; the security event's reason,
    and the `code` a client reads in the structured content), and what the model is told."""

    status: int
    reason: str
    message: str
    # Whether the same call sent again may pass (the database back).
    retryable: bool = False


def result_schema() -> dict[str, Any]:
    """The result contract as JSON Schema, from the model the API documents its answers with:
    every tool's outputSchema."""
    return CallResultDoc.model_json_schema()


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
        )
        for spec in selectors.tools_for_agent(agent)
    ]


def call_result(result: CallResult) -> types.CallToolResult:
    """The result contract as MCP carries it: model_text for the model, the contract as data.

    A held call is not an error: the model should tell the user it waits for a human.
    """
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.model_text)],
        structured_content=result.as_dict(),
        is_error=not result.ok and result.code != codes.CONFIRMATION_REQUIRED.name,
    )


def agent_refusal(agent: Agent | None) -> HostRefusal | None:
    """Why this agent may call nothing, or None."""
    if agent is None:
        return HostRefusal(
            401,
            "authentication_failed",
            "Toolgate: this agent's token is no longer valid, or the agent is disabled; nothing "
            "was done. Tell the user that the tool is unavailable.",
        )
    if agent.current_policy_id is None:
        return HostRefusal(
            403,
            "permission_denied",
            "Toolgate: this agent has no policy yet; nothing was done. Tell the user that the "
            "tool is unavailable.",
        )
    return None


def host_refusal(host: Host) -> HostRefusal | None:
    """Why the host's side leaves no way to dispatch a call, or None."""
    refusal = agent_refusal(host.agent)
    if refusal is not None:
        return refusal
    if not host.customer_id:
        return HostRefusal(
            400,
            "customer_missing",
            f"Toolgate: the host gave no customer ({CUSTOMER_HEADER} over HTTP, --customer of "
            "mcp_serve over stdio), so no tool can run; nothing was done. Tell the user the "
            "assistant is not set up for a customer.",
        )
    if not re.fullmatch(CUSTOMER_ID_PATTERN, host.customer_id):
        return HostRefusal(
            400,
            "customer_invalid",
            "Toolgate: the host's customer id is not valid (ASCII letters, digits, . _ : -, up "
            "to 64); nothing was done.",
        )
    if not host.session_id or not re.fullmatch(SESSION_ID_PATTERN, host.session_id):
        return HostRefusal(
            400,
            "session_invalid" if host.session_id else "session_missing",
            f"Toolgate: no valid session: the host sends {SESSION_HEADER} (ASCII letters, "
            f"digits, . _ : -, up to 128) or uses an MCP session ({MCP_SESSION_HEADER}) over "
            f"HTTP, and names it with --session or {SESSION_VARIABLE} over stdio; nothing was "
            "done.",
        )
    return None


SESSION_CONFLICT = HostRefusal(
    409,
    "session_conflict",
    "Toolgate: this session is bound to another customer; the host must open a new session for "
    "this customer. Nothing was done.",
)
# The database went away under the call (the API's 503 `database_unavailable`): retryable.
DATABASE_UNAVAILABLE = HostRefusal(
    503,
    "database_unavailable",
    "Toolgate: the database is unavailable; nothing was done. Send the same call again in a "
    "moment.",
    retryable=True,
)


def refusal_contract(tool: str, refusal: HostRefusal) -> dict[str, Any]:
    """A refusal in the result contract's shape, so that it validates against the outputSchema
    as every answer does: no call was made (an empty call_id), its code is the refusal's and its
    data the status the API would have answered."""
    return CallResult(
        call_id="",
        ok=False,
        tool=tool,
        code=refusal.reason,
        message=refusal.message,
        data={"status": refusal.status},
        retryable=refusal.retryable,
        model_text=refusal.message,
    ).as_dict()


def refusal_record(host: Host, refusal: HostRefusal) -> None:
    """A refusal on the host's side, recorded as a security event as the API records its own."""
    security_event_record(
        origin=host.origin,
        agent=host.agent,
        status=refusal.status,
        reason=refusal.reason,
        detail=refusal.message,
    )


def refused(host: Host, tool: str, refusal: HostRefusal) -> types.CallToolResult:
    """A call refused on the host's side: recorded, and answered as the tool's error with its
    code; nothing ran."""
    refusal_record(host, refusal)
    return refusal_result(tool, refusal)


def refusal_result(tool: str, refusal: HostRefusal) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=refusal.message)],
        structured_content=refusal_contract(tool, refusal),
        is_error=True,
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


async def _in_django(work: Callable[[], _T]) -> _T:
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


HostOf = Callable[[ServerRequestContext[Any, Any]], Host]
# A tools/call's arguments as the door read them (strict JSON), or None if it has none for it.
ArgumentsOf = Callable[[ServerRequestContext[Any, Any]], Mapping[str, Any] | None]


def server_instructions() -> str:
    """What a client is told once: what is held for a human, in the declared tools' words."""
    return (
        "Toolgate checks every tool call before anything happens. Amounts are integers in minor "
        f"units; {held_plurals(tool_registry)} may be held for a human (CONFIRMATION_REQUIRED): "
        "tell the user, and check later with get_confirmation_status where you have that tool."
    )


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

        return types.ListToolsResult(tools=await _in_django(listed))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        # The arguments as the door read them, as the API reads its own: the SDK's reading of
        # the same message has the same keys and values (the door refused what is ambiguous)
        # but loses how a number was written (80.00, which the hint for minor units follows).
        read = arguments_of(ctx)
        same = read is not None and _same_arguments(read, params.arguments)
        arguments = read if same else params.arguments
        return await _in_django(lambda: tool_call(host_of(ctx), params.name, arguments))

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=server_instructions(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


# Both transports: a message is read as strict JSON first ------------------------------------------

MALFORMED_MESSAGE = "malformed_message"


def unreadable_answer(
    origin: Origin, agent: Agent | None, raw: bytes, unreadable: doors.Unreadable
) -> types.JSONRPCError:
    """A message that is not strict JSON (dispatch.doors), which the SDK would have read its own
    way (the last of two keys): recorded as the API records a malformed body, and answered with a
    JSON-RPC parse error carrying the API's error; nothing reaches a tool."""
    where = f"'s {unreadable.field}:" if unreadable.field else " is"
    message = f"The message{where} {unreadable}; nothing was done."
    security_event_record(
        origin=origin, agent=agent, status=400, reason=MALFORMED_MESSAGE, detail=message
    )
    request_id, _ = _head(raw)
    api_error = error_body(status_code=400, code=MALFORMED_MESSAGE, message=message)["error"]
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=types.PARSE_ERROR, message=message, data=api_error),
    )


ReadArguments = dict[types.RequestId, Mapping[str, Any]]


def tool_call_arguments(message: Any) -> ReadArguments:
    """The arguments of each tools/call request in a message (or a batch) as the door read it,
    by request id."""
    found: ReadArguments = {}
    for request in message if isinstance(message, list) else [message]:
        if not isinstance(request, dict) or request.get("method") != "tools/call":
            continue
        request_id, params = request.get("id"), request.get("params")
        arguments = params.get("arguments") if isinstance(params, dict) else None
        # An id is a string or an integer; JSON's true is neither, though Python's bool is an int.
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            continue
        if isinstance(arguments, dict):
            found[request_id] = arguments
    return found


def _same_arguments(read: Mapping[str, Any], parsed: Mapping[str, Any] | None) -> bool:
    # The same keys, in the same order, and values of the same JSON types: what tells the door's
    # reading of a request from another's that reused its id while it was pending.
    return json.dumps(read) == json.dumps(parsed or {})


def _head(raw: bytes) -> tuple[types.RequestId | None, str]:
    """The id and the method of a refused message, where they can be read without doubt: the
    id lets the client's request end with the error rather than wait (JSON-RPC's is null
    otherwise), the method is what a security event over stdio names."""
    try:
        # Read leniently, only for these two: objects as their (key, value) pairs, in order.
        pairs = json.loads(raw, object_pairs_hook=tuple)
    except ValueError:
        return None, ""
    if type(pairs) is not tuple:
        return None, ""
    ids = [value for key, value in pairs if key == "id"]
    methods = [value for key, value in pairs if key == "method"]
    request_id = ids[0] if len(ids) == 1 and type(ids[0]) in (int, str) else None
    method = methods[0] if len(methods) == 1 and isinstance(methods[0], str) else ""
    return request_id, method


# stdio ------------------------------------------------------------------------------------------


def stdio_host(token: str, customer_id: str | None, session_id: str | None = None) -> HostOf:
    """The host of a stdio process: its agent (looked up again on every request, so that a
    disabled agent or a new policy applies at once), its session, its customer.

    The session is the conversation the host named, which outlives the process: a server the
    host starts again for that conversation replays its calls. Without a name it is one of the
    process's own, which ends with it."""
    session_id = session_id or f"mcp-{secrets.token_hex(16)}"

    def host_of(ctx: ServerRequestContext[Any, Any]) -> Host:
        return Host(agent_authenticate(token), session_id, customer_id, stdio_origin(ctx.method))

    return host_of


def stdio_origin(method: str) -> Origin:
    """Where a request over stdio came in: with no HTTP request, its JSON-RPC method stands for
    the method, and `stdio` for the path."""
    return Origin(CallChannel.MCP, method, STDIO_PATH)


class StrictLines:
    """Standard input as the SDK's stdio transport reads it, a message a line: each line read
    first as strict JSON (dispatch.doors), and one that is not handed to `refuse` instead, never
    on to the SDK."""

    # Arguments kept for calls read and not yet run; a client with more calls in flight than
    # this loses the oldest ones' (which then run on the SDK's reading of them, as does a call
    # whose id another request reused meanwhile).
    KEPT_ARGUMENTS = 256

    def __init__(
        self,
        lines: AsyncIterable[bytes],
        refuse: Callable[[bytes, doors.Unreadable], Awaitable[None]],
    ) -> None:
        self.lines = lines
        self.refuse = refuse
        self.arguments: ReadArguments = {}

    async def __aiter__(self) -> AsyncIterator[str]:
        async for line in self.lines:
            if not line.strip():
                continue
            try:
                message = doors.message_read(line)
            except doors.Unreadable as unreadable:
                await self.refuse(line, unreadable)
                continue
            self.arguments |= tool_call_arguments(message)
            while len(self.arguments) > self.KEPT_ARGUMENTS:
                del self.arguments[next(iter(self.arguments))]
            yield line.decode("utf-8")

    def arguments_of(self, ctx: ServerRequestContext[Any, Any]) -> Mapping[str, Any] | None:
        """The arguments of the tools/call `ctx` runs, as read; given once."""
        if ctx.request_id is None:
            return None
        return self.arguments.pop(ctx.request_id, None)


async def serve_stdio(token: str, customer_id: str | None, session_id: str | None = None) -> None:
    """Serve the agent of `token` for `customer_id` over this process's stdin and stdout, in the
    session the host named (or one of the process's own)."""
    # A refused line is answered through the transport's own writer, the one that writes every
    # answer, so that no two writes interleave on stdout.
    answer, answers = anyio.create_memory_object_stream[SessionMessage](1)

    async def refuse(line: bytes, unreadable: doors.Unreadable) -> None:
        origin = stdio_origin(_head(line)[1])
        error = await _in_django(
            lambda: unreadable_answer(origin, agent_authenticate(token), line, unreadable)
        )
        await answer.send(SessionMessage(error))

    async def answer_refusals(writer: _Writer) -> None:
        # On a writer of its own (a clone of the transport's), which the server's closing does
        # not close: a refusal read just before stdin ended is still answered.
        try:
            async with answers:
                async for message in answers:
                    await writer.send(message)
        finally:
            await writer.aclose()

    stdin = StrictLines(anyio.wrap_file(sys.stdin.buffer), refuse)
    server = mcp_server(stdio_host(token, customer_id, session_id), stdin.arguments_of)
    # The transport only iterates its stdin, line by line.
    async with (
        stdio_server(stdin=cast("anyio.AsyncFile[str]", stdin)) as (read_stream, write_stream),
        anyio.create_task_group() as tasks,
    ):
        tasks.start_soon(answer_refusals, write_stream.clone())
        await server.run(read_stream, write_stream, server.create_initialization_options())
        # Stdin has ended: no more refusals; those sent are answered before the writer ends.
        answer.close()


def refusal_error(status: int, code: str, message: str) -> types.ErrorData:
    """A refusal on the host's side as a JSON-RPC error: the reason as its message, for the
    client to show, and the API's error for the status and code as its data."""
    return types.ErrorData(
        code=types.INVALID_REQUEST if status < 500 else types.INTERNAL_ERROR,
        message=message,
        data=error_body(status_code=status, code=code, message=message)["error"],
    )


def refuse_stdio(error: types.ErrorData, lines: Iterable[bytes], out: BinaryIO) -> None:
    """A stdio server that may not serve (a missing or wrong token, say): every request it is
    sent, `initialize` first, is answered with `error` until its client closes standard input,
    so that the client shows the reason rather than a closed connection."""
    for line in lines:
        request_id, method = _head(line)
        if request_id is None or not method:
            # A notification, or nothing readable enough to answer.
            continue
        answer = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        out.write(answer.model_dump_json(by_alias=True, exclude_none=True).encode() + b"\n")
        out.flush()


class _Writer(Protocol):
    """The transport's writer, as the refusals' answers use it."""

    async def send(self, message: SessionMessage, /) -> None: ...

    async def aclose(self) -> None: ...


# streamable HTTP ---------------------------------------------------------------------------------


def http_origin(scope: Scope) -> Origin:
    """Where a request over HTTP came in, its client's address read as the API reads it."""
    client = scope.get("client")
    forwarded_for = Headers(scope=scope).get("x-forwarded-for", "")
    address = forwarded_client_address(client[0] if client else "", forwarded_for)
    return Origin(CallChannel.MCP, scope.get("method", ""), scope.get("path", ""), address or None)


def _http_host(ctx: ServerRequestContext[Any, Any]) -> Host:
    request = ctx.request
    if request is None:  # pragma: no cover - every message over HTTP carries its request
        return Host(None, None, None, Origin(CallChannel.MCP, ctx.method, HTTP_PATH))
    headers = request.headers
    # The host's own conversation id if it sends one (a stateless client has no MCP session).
    session_id = headers.get(SESSION_HEADER) or headers.get(MCP_SESSION_HEADER)
    return Host(
        request.scope.get(_AGENT_SCOPE_KEY),
        session_id,
        headers.get(CUSTOMER_HEADER),
        http_origin(request.scope),
    )


def _refusal(
    origin: Origin, agent: Agent | None, status: int, code: str, message: str, **headers: str
) -> JSONResponse:
    """An HTTP refusal, recorded as the API records its own. The body is a JSON-RPC error whose
    data is the API's error: an MCP client shows a JSON-RPC error's message whatever the status,
    where it shows only the status of any other body."""
    if status in RECORDED_STATUSES:
        security_event_record(
            origin=origin, agent=agent, status=status, reason=code, detail=message
        )
    # The request's id is not read yet: JSON-RPC's null id, which the SDK's client takes as the
    # answer to the request it posted.
    body = types.JSONRPCError(jsonrpc="2.0", id=None, error=refusal_error(status, code, message))
    return JSONResponse(
        {**body.model_dump(mode="json", by_alias=True, exclude_none=True), "id": None},
        status_code=status,
        headers=headers,
    )


# A static token, not OAuth: the challenge names the scheme MCP clients send it under, and the
# realm, with no resource metadata to start OAuth from; a wrong token adds RFC 6750's error. The
# body says what to send; the MCP Inspector starts OAuth on any 401 all the same (the README,
# "MCP clients", says what it shows then).
_CHALLENGE = 'Bearer realm="toolgate"'
_WRONG_TOKEN_CHALLENGE = (
    f'{_CHALLENGE}, error="invalid_token", error_description="not the token of an active agent; '
    'Toolgate takes the static token create_agent prints, and runs no OAuth"'
)
NO_TOKEN_MESSAGE = (
    "Authentication credentials were not provided: send 'Authorization: Bearer <token>' with the "
    "agent's static token, which create_agent prints once; this server runs no OAuth."
)
NO_OAUTH_MESSAGE = (
    "This server runs no OAuth: it takes the agent's static token as 'Authorization: Bearer "
    "<token>' (create_agent prints it once)."
)
# Where OAuth clients look for a protected resource's or an authorization server's metadata.
WELL_KNOWN_PREFIX = "/.well-known/"


def _admitted(origin: Origin, header: bytes) -> Agent | JSONResponse:
    """The agent of an Authorization header, authenticated and throttled as the API does it, or
    the API's answer to a request it refuses."""
    try:
        try:
            authenticated = AgentTokenAuthentication().from_header(header, origin.client_address)
        except AuthenticationThrottled as throttled:
            return _refusal(
                origin,
                None,
                429,
                THROTTLED_REASON,
                str(throttled.detail),
                **{"Retry-After": str(throttled.wait)},
            )
        except AuthenticationFailed as failed:
            message = f"{failed.detail} {NO_OAUTH_MESSAGE}"
            return _refusal(
                origin,
                None,
                401,
                "authentication_failed",
                message,
                **{"WWW-Authenticate": _WRONG_TOKEN_CHALLENGE},
            )
        if authenticated is None:
            return _refusal(
                origin,
                None,
                401,
                "not_authenticated",
                NO_TOKEN_MESSAGE,
                **{"WWW-Authenticate": _CHALLENGE},
            )
        agent: Agent = authenticated[0]
        if agent.current_policy_id is None:
            return _refusal(origin, agent, 403, "permission_denied", IsAgent.message)
        try:
            wait = agent_throttle_wait(agent)
        except RateLimiterUnavailable:
            down = RateLimiterDown
            return _refusal(origin, agent, 503, down.default_code, str(down.default_detail))
        if wait:
            seconds = str(math.ceil(wait))
            message = f"Request was throttled. Expected available in {seconds} seconds."
            return _refusal(origin, agent, 429, "throttled", message, **{"Retry-After": seconds})
        return agent
    finally:
        connections.close_all()


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, read whole; None once it is over `limit` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # The client left; what it sent is all there is.
            return bytes(body)
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app behind, with the body already read given back first."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class StrictMessages:
    """Every message posted over HTTP is read first as strict JSON (dispatch.doors), as the API
    reads its bodies, and refused before the SDK parses it otherwise: 400 with a JSON-RPC parse
    error, or 413 over the API's body limit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        limit = settings.TOOLGATE_MAX_BODY_BYTES
        origin, agent = http_origin(scope), scope.get(_AGENT_SCOPE_KEY)
        body = await _body(receive, limit)
        if body is None:
            message = f"The body is over the limit of {limit} bytes."
            too_large = await _in_django(
                partial(_refusal, origin, agent, 413, "payload_too_large", message)
            )
            await too_large(scope, receive, send)
            return
        try:
            message = doors.message_read(body)
        except doors.Unreadable as unreadable:
            error = await _in_django(partial(unreadable_answer, origin, agent, body, unreadable))
            refused = Response(
                error.model_dump_json(by_alias=True, exclude_unset=True),
                status_code=400,
                media_type="application/json",
            )
            await refused(scope, receive, send)
            return
        if _modern_without_host_session(scope, message):
            await _unsupported_era(body, Headers(scope=scope))(scope, receive, send)
            return
        scope[_ARGUMENTS_SCOPE_KEY] = tool_call_arguments(message)
        await self.app(scope, _replaying(body, receive), send)


def _modern_without_host_session(scope: Scope, message: Any) -> bool:
    """Whether a request is of a protocol version without MCP sessions (2026-07-28: a request
    stands alone) from a host that names no conversation: then nothing would tie a retried
    refund to the first, which would be held as a possible duplicate or run again."""
    headers = Headers(scope=scope)
    version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
    is_request = isinstance(message, dict) and "id" in message
    return (
        is_request
        and version is not None
        and version not in HANDSHAKE_PROTOCOL_VERSIONS
        and not headers.get(SESSION_HEADER)
    )


def _unsupported_era(body: bytes, headers: Headers) -> Response:
    """The protocol's own answer (-32022) to a request of a version the server does not offer
    this host: the versions it does, those of the initialize handshake, to which a client falls
    back; its MCP session is then the Toolgate session."""
    request_id, _ = _head(body)
    requested = headers.get(MCP_PROTOCOL_VERSION_HEADER, "")
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message=(
                f"Protocol {requested} has no MCP session: Toolgate offers it only to a host "
                f"that names its conversation in {SESSION_HEADER}; use the initialize handshake."
            ),
            data=types.UnsupportedProtocolVersionErrorData(
                supported=list(HANDSHAKE_PROTOCOL_VERSIONS), requested=requested
            ).model_dump(mode="json"),
        ),
    )
    return Response(
        error.model_dump_json(by_alias=True, exclude_none=True),
        status_code=ERROR_CODE_HTTP_STATUS[types.UNSUPPORTED_PROTOCOL_VERSION],
        media_type="application/json",
    )


def _http_arguments(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, Any] | None:
    request = ctx.request
    if request is None or ctx.request_id is None:  # pragma: no cover - as in _http_host
        return None
    read: ReadArguments = request.scope.get(_ARGUMENTS_SCOPE_KEY, {})
    return read.get(ctx.request_id)


class AgentTokenRequired:
    """Every HTTP request carries an agent's token and is within its rate, or is refused before
    MCP sees it, as the API refuses it: 401, 403, 429 or 503."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path", "").startswith(WELL_KNOWN_PREFIX):
            # No OAuth metadata, and no token asked for it: a 401 here would send an OAuth client
            # looking for an authorization server that does not exist.
            body = error_body(status_code=404, code="not_found", message=NO_OAUTH_MESSAGE)
            await JSONResponse(body, status_code=404)(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization", "").encode("latin-1")
        admitted = await anyio.to_thread.run_sync(partial(_admitted, http_origin(scope), header))
        if isinstance(admitted, JSONResponse):
            await admitted(scope, receive, send)
            return
        scope[_AGENT_SCOPE_KEY] = admitted
        await self.app(scope, receive, send)


def http_app(*, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable-HTTP server at /mcp; `host` is where it listens (on a loopback address the
    SDK also refuses requests whose Host or Origin is not a loopback one)."""
    server = mcp_server(_http_host, _http_arguments)
    sdk_app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    return AgentTokenRequired(StrictMessages(sdk_app))

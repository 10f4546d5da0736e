"""How the MCP server is served: over stdio for a client that starts it (`mcp_serve`), and over
streamable HTTP at /mcp (the ASGI app uvicorn runs), where every request is authenticated with an
agent's static token and throttled as the API does it before MCP sees it; and how a server that
may not serve, or a request refused before MCP, is answered.
"""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any, BinaryIO, Protocol, cast

import anyio
import mcp.types as types
from django.conf import settings
from django.db import connections
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from rest_framework.exceptions import AuthenticationFailed
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatch import doors
from dispatch.auth_failures import THROTTLED_REASON
from dispatch.authentication import AgentTokenAuthentication, IsAgent, agent_throttle_wait
from dispatch.errors import AuthenticationThrottled, RateLimiterDown, error_body
from dispatch.mcp.messages import (
    ReadArguments,
    message_head,
    tool_call_arguments,
    unreadable_answer,
)
from dispatch.mcp.results import refusal_error
from dispatch.mcp.sessions import (
    AGENT_SCOPE_KEY,
    HTTP_PATH,
    http_host,
    http_origin,
    modern_without_host_session,
    stdio_host,
    stdio_origin,
    unsupported_era,
)
from dispatch.mcp.tools import in_django, mcp_server
from dispatch.models import Agent
from dispatch.security import RECORDED_STATUSES, Origin, security_event_record
from dispatch.services import agent_authenticate
from dispatch.throttling import RateLimiterUnavailable

# Over stdio, where the agent's token is: in the process's environment.
TOKEN_VARIABLE = "TOOLGATE_TOKEN"
# Where the HTTP transport leaves the arguments of the request's tools/call messages as it read
# them.
_ARGUMENTS_SCOPE_KEY = "toolgate.arguments"


# stdio ------------------------------------------------------------------------------------------


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
        origin = stdio_origin(message_head(line)[1])
        error = await in_django(
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


def refuse_stdio(error: types.ErrorData, lines: Iterable[bytes], out: BinaryIO) -> None:
    """A stdio server that may not serve (a missing or wrong token, say): every request it is
    sent, `initialize` first, is answered with `error` until its client closes standard input,
    so that the client shows the reason rather than a closed connection."""
    for line in lines:
        request_id, method = message_head(line)
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
# body says what to send; the MCP Inspector starts OAuth on any 401 all the same (docs/mcp.md,
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
        origin, agent = http_origin(scope), scope.get(AGENT_SCOPE_KEY)
        body = await _body(receive, limit)
        if body is None:
            message = f"The body is over the limit of {limit} bytes."
            too_large = await in_django(
                partial(_refusal, origin, agent, 413, "payload_too_large", message)
            )
            await too_large(scope, receive, send)
            return
        try:
            message = doors.message_read(body)
        except doors.Unreadable as unreadable:
            error = await in_django(partial(unreadable_answer, origin, agent, body, unreadable))
            refused = Response(
                error.model_dump_json(by_alias=True, exclude_unset=True),
                status_code=400,
                media_type="application/json",
            )
            await refused(scope, receive, send)
            return
        if modern_without_host_session(scope, message):
            await unsupported_era(body, Headers(scope=scope))(scope, receive, send)
            return
        scope[_ARGUMENTS_SCOPE_KEY] = tool_call_arguments(message)
        await self.app(scope, _replaying(body, receive), send)


def _http_arguments(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, Any] | None:
    request = ctx.request
    if request is None or ctx.request_id is None:  # pragma: no cover - as in http_host
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
        scope[AGENT_SCOPE_KEY] = admitted
        await self.app(scope, receive, send)


def http_app(*, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable-HTTP server at /mcp; `host` is where it listens (on a loopback address the
    SDK also refuses requests whose Host or Origin is not a loopback one)."""
    server = mcp_server(http_host, _http_arguments)
    sdk_app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    return AgentTokenRequired(StrictMessages(sdk_app))

"""Who calls over MCP: the agent, the session and the customer an MCP request stands for, which
the host vouches for and the model never chooses, and why the host's side may leave no way to call.

Over stdio (`mcp_serve`) they are the process's: the token in TOOLGATE_TOKEN, the session the host
names (`--session`, TOOLGATE_SESSION) or else one for each call, `--customer`. Over streamable
HTTP they come with each request: the agent its token names, the host's X-Toolgate-Session or else
the MCP session, and X-Toolgate-Customer. Over either, a tools/call may name its conversation and
its customer in its `_meta` (CONVERSATION_META, CUSTOMER_META), which a host that serves many
conversations on one connection does; they come before the rest. Protocol 2026-07-28 has no
MCP session, so over HTTP it is offered only to a host that names its conversations with
X-Toolgate-Session; any other client is told so (-32022) and falls back to the initialize
handshake, whose Mcp-Session-Id is then the session.

What is refused on the host's side is recorded as a security event (dispatch.security), as the API
records its own, with the channel `mcp`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from dispatch.client_address import forwarded_client_address
from dispatch.envelopes import CUSTOMER_ID_PATTERN, SESSION_ID_PATTERN
from dispatch.mcp.messages import message_head
from dispatch.mcp.results import HostRefusal, refusal_result
from dispatch.models import Agent, CallChannel
from dispatch.security import Origin, security_event_record
from dispatch.services import agent_authenticate

# Over stdio, the conversation the host starts this server for, as an option or in the environment.
SESSION_VARIABLE = "TOOLGATE_SESSION"
CUSTOMER_HEADER = "X-Toolgate-Customer"
SESSION_HEADER = "X-Toolgate-Session"
MCP_SESSION_HEADER = "Mcp-Session-Id"
# Where the streamable-HTTP server serves MCP, and what a security event over stdio gives for its
# path: the process has no HTTP request.
HTTP_PATH = "/mcp"
STDIO_PATH = "stdio"
# Where the HTTP transport leaves the agent that the request's token belongs to.
AGENT_SCOPE_KEY = "toolgate.agent"
# What a host puts in a tools/call's `_meta` to name the conversation and the customer of that
# call: the keys are Toolgate's own (the protocol reserves `io.modelcontextprotocol/`).
CONVERSATION_META = "toolgate/conversation"
CUSTOMER_META = "toolgate/customer"
# A value in `_meta` that is not a string: never a valid id, so refused as an invalid one.
_NOT_AN_ID = "?"


@dataclass(frozen=True, slots=True)
class Host:
    """What the agent host vouches for, for one request: never anything the model said; and
    where the request came in, which a refusal's security event keeps."""

    agent: Agent | None
    session_id: str | None
    customer_id: str | None
    origin: Origin


HostOf = Callable[[ServerRequestContext[Any, Any]], Host]


def named_by_call(host: Host, meta: Mapping[str, Any] | None) -> Host:
    """The host of one tools/call, with the conversation and the customer its `_meta` names (a
    host's word, as a header is: the model writes only a call's name and arguments)."""
    if not meta:
        return host
    session_id, customer_id = host.session_id, host.customer_id
    if CONVERSATION_META in meta:
        session_id = _meta_id(meta[CONVERSATION_META])
    if CUSTOMER_META in meta:
        customer_id = _meta_id(meta[CUSTOMER_META])
    return replace(host, session_id=session_id, customer_id=customer_id)


def _meta_id(value: Any) -> str:
    return value if isinstance(value, str) else _NOT_AN_ID


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
            f"Toolgate: the host gave no customer ({CUSTOMER_META} in the call's _meta, "
            f"{CUSTOMER_HEADER} over HTTP, --customer of mcp_serve over stdio), so no tool can "
            "run; nothing was done. Tell the user the assistant is not set up for a customer.",
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
            f"Toolgate: no valid session: the host names the conversation in the call's _meta "
            f"({CONVERSATION_META}) or sends {SESSION_HEADER} (ASCII letters, digits, . _ : -, "
            f"up to 128) or uses an MCP session ({MCP_SESSION_HEADER}) over HTTP, and names it "
            f"with --session or {SESSION_VARIABLE} over stdio; nothing was done.",
        )
    return None


SESSION_CONFLICT = HostRefusal(
    409,
    "session_conflict",
    "Toolgate: this session is bound to another customer; the host must open a new session for "
    "this customer. Nothing was done.",
)


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


# stdio ------------------------------------------------------------------------------------------


def stdio_host(token: str, customer_id: str | None, session_id: str | None = None) -> HostOf:
    """The host of a stdio process: its agent (looked up again on every request, so that a
    disabled agent or a new policy applies at once), its session, its customer.

    The session is the conversation the host named, which outlives the process: a server the
    host starts again for that conversation replays its calls. Without a name it is each call's
    own: a host may serve all its conversations with one process (Claude Desktop does), and
    nothing here tells them apart, so no two calls share a step budget or a replay."""

    def host_of(ctx: ServerRequestContext[Any, Any]) -> Host:
        session = session_id or f"mcp-call-{secrets.token_hex(16)}"
        return Host(agent_authenticate(token), session, customer_id, stdio_origin(ctx.method))

    return host_of


def stdio_origin(method: str) -> Origin:
    """Where a request over stdio came in: with no HTTP request, its JSON-RPC method stands for
    the method, and `stdio` for the path."""
    return Origin(CallChannel.MCP, method, STDIO_PATH)


# streamable HTTP ---------------------------------------------------------------------------------


def http_origin(scope: Scope) -> Origin:
    """Where a request over HTTP came in, its client's address read as the API reads it."""
    client = scope.get("client")
    forwarded_for = Headers(scope=scope).get("x-forwarded-for", "")
    address = forwarded_client_address(client[0] if client else "", forwarded_for)
    return Origin(CallChannel.MCP, scope.get("method", ""), scope.get("path", ""), address or None)


def http_host(ctx: ServerRequestContext[Any, Any]) -> Host:
    """The host of a request over HTTP: the agent its token names, its session and customer."""
    request = ctx.request
    if request is None:  # pragma: no cover - every message over HTTP carries its request
        return Host(None, None, None, Origin(CallChannel.MCP, ctx.method, HTTP_PATH))
    headers = request.headers
    # The host's own conversation id if it sends one (a stateless client has no MCP session).
    session_id = headers.get(SESSION_HEADER) or headers.get(MCP_SESSION_HEADER)
    return Host(
        request.scope.get(AGENT_SCOPE_KEY),
        session_id,
        headers.get(CUSTOMER_HEADER),
        http_origin(request.scope),
    )


def modern_without_host_session(scope: Scope, message: Any) -> bool:
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


def unsupported_era(body: bytes, headers: Headers) -> Response:
    """The protocol's own answer (-32022) to a request of a version the server does not offer
    this host: the versions it does, those of the initialize handshake, to which a client falls
    back; its MCP session is then the Toolgate session."""
    request_id, _ = message_head(body)
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

"""A small payments MCP server over streamable HTTP that the upstream tests start in a process of
its own (written with the MCP SDK's MCPServer): the edge that Toolgate does not own.

    python -m tests.upstreams.payments_mcp_server --state FILE --token TOKEN [--key MODE]

prints `PORT <n>` once it listens, and serves MCP at /mcp behind a bearer token. Its tools:
get_payment, create_refund, list_refunds and delete_payment (which no declaration names). Its
state is the HTTP stand-in's (tests/upstreams/payments_server.py), a JSON file written after every
change. `--key meta` honours an idempotency key in the call's `_meta` (KEY_META), `--key argument`
in create_refund's `idempotency_key` argument, `--key none` (the default) ignores both.

POST /_faults arms faults, each for the next N calls it applies to: lose_after_commit (refund,
then drop the connection unanswered), hang_after_commit (refund, then never answer), slow and
slow_write (sleep `slow_seconds` first), malformed (a read's answer is not JSON), wrong_schema (a
read answers JSON of another shape), markup (a refund refused with markup in its message), and
`tools`: "remove" (create_refund is no longer offered) or "tighten" (its amount is capped at 1000)
with `notify` (the next call carries notifications/tools/list_changed).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.upstreams.payments_server import Payments

KEY_META = "payments.example/idempotency-key"
FAULTS = (
    "lose_after_commit",
    "hang_after_commit",
    "slow",
    "slow_write",
    "malformed",
    "wrong_schema",
    "markup",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def answer(data: Any) -> CallToolResult:
    text = json.dumps(data)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def refused(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


class Served:
    """The server's state and what it was armed with."""

    def __init__(self, payments: Payments, key_mode: str) -> None:
        self.payments = payments
        self.key_mode = key_mode
        # Set by a refund whose answer is to be lost; the transport drops the answer.
        self.drop_answer = threading.Event()
        self.notify = False

    async def before(self, ctx: Context, fault: str) -> None:
        if self.notify:
            self.notify = False
            await ctx.session.send_tool_list_changed()
        if self.payments.fault(fault):
            await anyio.sleep(self.payments.slow_seconds)


def build(served: Served) -> MCPServer:
    server = MCPServer("payments", log_level="WARNING")
    payments = served.payments

    @server.tool()
    async def get_payment(payment_id: str, ctx: Context) -> CallToolResult:
        """One payment: amount, currency and what is already refunded."""
        await served.before(ctx, "slow")
        with payments.lock:
            payment = payments.state["payments"].get(payment_id)
        if payment is None:
            return refused("no such payment")
        if payments.fault("malformed"):
            return CallToolResult(content=[TextContent(type="text", text="{not json")])
        if payments.fault("wrong_schema"):
            return answer({"id": payment_id, "total": "lots"})
        return answer(payment)

    async def create_refund(
        payment_id: str,
        amount_cents: int,
        currency: str,
        reason: str,
        client_reference: str,
        ctx: Context,
        idempotency_key: str | None = None,
    ) -> CallToolResult:
        """Refund part of a payment."""
        await served.before(ctx, "slow_write")
        with payments.lock:
            payments.state["received"] += 1
            payments.save()
        if payments.fault("markup"):
            return refused('<script>alert("x")</script> refused <b>now</b>')
        key = None
        if served.key_mode == "argument":
            key = idempotency_key
        elif served.key_mode == "meta":
            meta = ctx.request_context.meta or {}
            found = meta.get(KEY_META)
            key = found if isinstance(found, str) else None
        body = {
            "amount_cents": amount_cents,
            "currency": currency,
            "reason": reason,
            "client_reference": client_reference,
        }
        status, result = payments.refund_once(key, payment_id, body)
        if status != 201:
            return refused(result["error"]["message"])
        if payments.fault("lose_after_commit"):
            served.drop_answer.set()
        if payments.fault("hang_after_commit"):
            await anyio.sleep(3600)
        return answer(result)

    async def create_refund_capped(
        payment_id: str,
        amount_cents: Annotated[int, Field(le=1000)],
        currency: str,
        reason: str,
        client_reference: str,
        ctx: Context,
        idempotency_key: str | None = None,
    ) -> CallToolResult:
        """Refund part of a payment, at most 10.00."""
        return refused("not served")

    @server.tool()
    async def list_refunds(client_reference: str) -> CallToolResult:
        """The refunds made under a client reference."""
        with payments.lock:
            found = [
                r for r in payments.state["refunds"] if r["client_reference"] == client_reference
            ]
        return answer({"refunds": found})

    @server.tool()
    async def delete_payment(payment_id: str) -> CallToolResult:
        """Delete a payment (no declaration exposes this)."""
        return refused("not allowed")

    server.add_tool(create_refund)

    async def faults(request: Request) -> Response:
        body = await request.json()
        with payments.lock:
            for name in FAULTS:
                payments.faults[name] = int(body.get(name, 0))
            payments.slow_seconds = float(body.get("slow_seconds", 0))
        change = body.get("tools")
        if change in ("remove", "tighten"):
            server.remove_tool("create_refund")
        if change == "tighten":
            server.add_tool(create_refund_capped, name="create_refund")
        served.notify = bool(body.get("notify"))
        return JSONResponse({"armed": payments.faults})

    server.custom_route("/_faults", methods=["POST"])(faults)
    return server


def guarded(
    app: Callable[[Scope, Receive, Send], Awaitable[None]], served: Served, token: str
) -> Any:
    """The app behind a bearer token; and an answer to be lost is dropped with its connection."""

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if headers.get(b"authorization") != f"Bearer {token}".encode():
            await JSONResponse({"error": "missing or wrong credentials"}, 401)(scope, receive, send)
            return

        async def dropping(message: Message) -> None:
            answering = message["type"] == "http.response.body"
            if (
                answering
                and served.drop_answer.is_set()
                and b"refund_id" in message.get("body", b"")
            ):
                served.drop_answer.clear()
                raise ConnectionAbortedError("answer lost")
            await send(message)

        await app(scope, receive, dropping)

    return guard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", choices=("none", "meta", "argument"), default="none")
    options = parser.parse_args()
    payments = Payments(options.state, honours_key=options.key != "none")
    served = Served(payments, options.key)
    app = guarded(build(served).streamable_http_app(), served, options.token)
    config = uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning")
    server = uvicorn.Server(config)

    async def serve() -> None:
        import socket

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", options.port))
        sock.listen(128)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        sys.stdout.close()
        await server.serve(sockets=[sock])

    anyio.run(serve)


if __name__ == "__main__":
    main()

"""Serve the agent's tools over MCP: stdio for a local client, streamable HTTP for remote ones."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch import mcp
from dispatch.envelopes import CUSTOMER_ID_PATTERN, SESSION_ID_PATTERN
from dispatch.models import Agent
from dispatch.security import security_event_record
from dispatch.services import agent_authenticate

# What a refusal at the start of a stdio server records for its method: no message was read yet.
START_METHOD = "mcp_serve"


class Command(BaseCommand):
    help = (
        "Serve Toolgate's tools over the Model Context Protocol, every call through the "
        f"pipeline. stdio: the agent's token in {mcp.TOKEN_VARIABLE}, the customer in "
        f"--customer and the conversation in --session or {mcp.SESSION_VARIABLE}. http: each "
        f"request sends 'Authorization: Bearer <token>' and {mcp.CUSTOMER_HEADER}, at "
        f"http://HOST:PORT{mcp.HTTP_PATH}."
    )
    # The stdio server must own stdout from its first byte: no system checks printed there.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--transport",
            choices=("stdio", "http"),
            default="stdio",
            help="stdio for a client that starts the server (default), http for remote clients",
        )
        parser.add_argument(
            "--customer",
            help="stdio: the customer the host authenticated; every call of this process is "
            f"bound to it unless the call names its own in its _meta ({mcp.CUSTOMER_META}); "
            "without either, tools are listed but no call runs",
        )
        parser.add_argument(
            "--session",
            help=f"stdio: the conversation the host starts this server for (or "
            f"{mcp.SESSION_VARIABLE}); a server started again with the same name keeps its "
            "calls, so an identical retry is replayed. Never a fixed name shared by "
            "conversations. Without it each call is a session of its own, unless the call "
            f"names its conversation in its _meta ({mcp.CONVERSATION_META})",
        )
        parser.add_argument(
            "--host", default="127.0.0.1", help="http: address (default %(default)s)"
        )
        parser.add_argument(
            "--port", type=int, default=8001, help="http: port (default %(default)s)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["transport"] == "http":
            if options["customer"]:
                raise CommandError(
                    f"--customer is for stdio; over HTTP the host sends {mcp.CUSTOMER_HEADER} "
                    "with each request."
                )
            if options["session"]:
                raise CommandError(
                    f"--session is for stdio; over HTTP the host sends {mcp.SESSION_HEADER} "
                    "with each request, or uses its MCP session."
                )
            self._serve_http(options["host"], options["port"])
            return
        token = os.environ.get(mcp.TOKEN_VARIABLE, "")
        if not token:
            raise _refused(
                None, 401, "not_authenticated", f"Set {mcp.TOKEN_VARIABLE} to the agent's token."
            )
        agent = agent_authenticate(token)
        if agent is None:
            raise _refused(
                None,
                401,
                "authentication_failed",
                f"{mcp.TOKEN_VARIABLE} is not the token of an active agent (invalid token, or "
                "the agent is disabled).",
            )
        if agent.current_policy_id is None:
            raise _refused(
                agent,
                403,
                "permission_denied",
                "This agent has no policy yet; an operator must give it one.",
            )
        customer = options["customer"]
        if customer is not None and not re.fullmatch(CUSTOMER_ID_PATTERN, customer):
            raise _refused(
                agent,
                400,
                "customer_invalid",
                "--customer: ASCII letters, digits, . _ : -, up to 64 characters.",
            )
        session = options["session"] or os.environ.get(mcp.SESSION_VARIABLE) or None
        if session is not None and not re.fullmatch(SESSION_ID_PATTERN, session):
            raise _refused(
                agent,
                400,
                "session_invalid",
                f"--session ({mcp.SESSION_VARIABLE}): ASCII letters, digits, . _ : -, up to 128 "
                "characters.",
            )
        anyio.run(mcp.serve_stdio, token, customer, session)

    def _serve_http(self, host: str, port: int) -> None:
        import uvicorn

        self.stderr.write(f"MCP over streamable HTTP at http://{host}:{port}{mcp.HTTP_PATH}")
        # One process, always: the MCP sessions live in its memory, where a second process would
        # not find them. uvicorn would otherwise take its number of processes from
        # WEB_CONCURRENCY, which is gunicorn's, and refuse to start with more than one.
        uvicorn.run(mcp.http_app(host=host), host=host, port=port, log_level="warning", workers=1)


def _refused(agent: Agent | None, status: int, reason: str, message: str) -> CommandError:
    """A stdio server refused at its start, recorded as the API records its refusals. Its client
    is told why in the answer to its first request (an error to `initialize`, which it shows),
    not left with a closed connection; the reason goes to standard error as the server ends."""
    security_event_record(
        origin=mcp.stdio_origin(START_METHOD),
        agent=agent,
        status=status,
        reason=reason,
        detail=message,
    )
    mcp.refuse_stdio(
        mcp.refusal_error(status, reason, message), sys.stdin.buffer, sys.stdout.buffer
    )
    return CommandError(message)

"""An MCP upstream over stdio: a server Toolgate starts as a process of its own and speaks to
with the MCP SDK's client.

Its declaration (McpStdioUpstream) names the command, the environment variables passed through
to it (its secrets stay in the environment), the upstream tools its declarations call, and the
argument Toolgate fills for every call (a state namespace such as τ²'s `state_key`): the model's
arguments never carry it, since each tool's argument model forbids fields it does not name.

One process serves one Toolgate process, started on first use; its calls take turns. On
connecting it lists what the server offers, and a declared tool the server does not offer is a
fault of every call (and drift for `check_upstreams`). A result flagged as an error is the
upstream's refusal, in its words, escaped.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal
from pydantic import BaseModel, ValidationError

from upstreams.drift_records import TOOL_MISSING, drift_record
from upstreams.http import (
    UpstreamBadAnswer,
    UpstreamDown,
    UpstreamNoAnswer,
    UpstreamRefusal,
    upstream_words,
)

logger = logging.getLogger(__name__)

Answer = TypeVar("Answer", bound=BaseModel)
# What a refusal reports as its status: MCP has none, a tool result flagged as an error.
TOOL_ERROR = 0


@dataclass(frozen=True, slots=True)
class McpStdioUpstream:
    name: str
    # The server's command line (the interpreter of this process where it is "python").
    command: tuple[str, ...]
    # The upstream tools its declarations call: each must be listed by the server.
    tools: tuple[str, ...]
    # Environment variables passed through to the server, and no others.
    env: tuple[str, ...] = ()
    # The argument Toolgate fills on every call, and its value from the call's customer.
    injected_argument: str | None = None
    injected_value: Callable[[str], str] | None = None
    # The time budget of one call.
    timeout_seconds: float = 10.0


@dataclass
class McpUpstream:
    """An McpStdioUpstream, connected on first use."""

    declared: McpStdioUpstream
    offered: frozenset[str] = field(default=frozenset(), init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stack: ExitStack | None = field(default=None, init=False, repr=False)
    _portal: BlockingPortal | None = field(default=None, init=False, repr=False)
    _session: Any = field(default=None, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def honours_idempotency_key(self) -> bool:
        # MCP has no such header: each write declares its outcome read.
        return False

    def call(
        self, tool: str, answer: type[Answer], arguments: Mapping[str, Any], *, customer_id: str
    ) -> Answer:
        """Call one of the declared upstream tools for a customer; its answer as `answer`."""
        if tool not in self.declared.tools:
            raise LookupError(f"upstream {self.name}: {tool!r} is not a declared tool")
        sent = dict(arguments)
        injected = self.declared.injected_argument
        if injected is not None and self.declared.injected_value is not None:
            sent[injected] = self.declared.injected_value(customer_id)
        with self._lock:
            session, portal = self._connected()
            try:
                result = portal.call(
                    lambda: session.call_tool(
                        tool, sent, read_timeout_seconds=self.declared.timeout_seconds
                    )
                )
            except Exception as error:
                # A timeout, or the process gone: the request may have been taken.
                logger.warning("upstream %s: %s %s", self.name, tool, type(error).__name__)
                self._close()
                raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
        text = "".join(getattr(part, "text", "") for part in getattr(result, "content", []))
        if getattr(result, "is_error", False):
            raise UpstreamRefusal(self.name, TOOL_ERROR, _error_words(text))
        structured = getattr(result, "structured_content", None)
        try:
            if structured is not None:
                return answer.model_validate(structured)
            return answer.model_validate_json(text)
        except ValidationError as error:
            where = sorted({".".join(map(str, e["loc"])) or e["type"] for e in error.errors()})
            raise UpstreamBadAnswer(
                self.name,
                f"its answer to {tool} does not match the declared shape "
                f"({upstream_words(', '.join(where[:5]))})",
            ) from None

    def listed(self) -> frozenset[str]:
        """The tools the server lists now (connecting if need be)."""
        with self._lock:
            self._connected()
            return self.offered

    def close(self) -> None:
        with self._lock:
            self._close()

    def _connected(self) -> tuple[Any, BlockingPortal]:
        if self._session is not None and self._portal is not None:
            return self._session, self._portal
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        command = list(self.declared.command)
        if command and command[0] == "python":
            command[0] = sys.executable
        env = {name: os.environ[name] for name in self.declared.env if name in os.environ}
        parameters = StdioServerParameters(command=command[0], args=command[1:], env=env)
        stack = ExitStack()
        try:
            portal = stack.enter_context(start_blocking_portal())
            streams: AbstractContextManager[Any] = portal.wrap_async_context_manager(
                stdio_client(parameters)
            )
            read, write = stack.enter_context(streams)
            session = stack.enter_context(
                portal.wrap_async_context_manager(ClientSession(read, write))
            )
            portal.call(session.initialize)
            listed = portal.call(session.list_tools)
        except Exception as error:
            stack.close()
            logger.warning("upstream %s: could not start (%s)", self.name, type(error).__name__)
            raise UpstreamDown(self.name, "it could not be started") from None
        self.offered = frozenset(tool.name for tool in listed.tools)
        missing = sorted(set(self.declared.tools) - self.offered)
        if missing:
            stack.close()
            logger.warning("upstream %s drifted: %s no longer offered", self.name, missing)
            for tool in missing:
                drift_record(
                    upstream=self.name,
                    tool=tool,
                    kind=TOOL_MISSING,
                    detail="the server did not list it when Toolgate connected",
                )
            raise UpstreamDown(self.name, f"it no longer offers {', '.join(missing)}")
        self._stack, self._portal, self._session = stack, portal, session
        return session, portal

    def _close(self) -> None:
        stack, self._stack, self._portal, self._session = self._stack, None, None, None
        if stack is not None:
            try:
                stack.close()
            except Exception:  # the process is gone already
                logger.info("upstream %s: closed", self.name)


def _error_words(text: str) -> str:
    try:
        loaded = json.loads(text)
    except ValueError:
        return upstream_words(text) or "it refused"
    if isinstance(loaded, Mapping):
        loaded = loaded.get("parsed_content", loaded.get("error", loaded))
    return upstream_words(loaded) or "it refused"

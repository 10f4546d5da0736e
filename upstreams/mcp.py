"""An MCP upstream: a server Toolgate starts as a process of its own and speaks to over stdio
(McpStdioUpstream), or one that runs elsewhere and is reached over streamable HTTP
(McpHttpUpstream), both with the MCP SDK's client.

Its declaration names the upstream tools its declarations call and the argument Toolgate fills
for every call (a state namespace such as τ²'s `state_key`): the model's arguments never carry
it, since each tool's argument model forbids fields it does not name. Secrets stay in the
environment: a stdio server gets only the variables its declaration names, an HTTP one's address
and bearer token are read from the variables its declaration names, at connecting, and written
nowhere.

One connection serves one Toolgate process, opened on first use; its calls take turns. On
connecting it lists what the server offers; a declared tool the server no longer offers, or whose
input schema is not the reviewed one (the snapshot the declaration names, else the one listed
first), is refused at every call (UpstreamChanged) and reported by `check_upstreams`; the server
listing again after notifications/tools/list_changed, or a call it refuses, updates that. A result
flagged as an error is the upstream's refusal, in its words, escaped.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal
from pydantic import BaseModel, ValidationError

from upstreams.drift_records import ANSWER_SHAPE, INPUT_SCHEMA, TOOL_MISSING, drift_record
from upstreams.http import (
    UpstreamBadAnswer,
    UpstreamChanged,
    UpstreamDown,
    UpstreamFailed,
    UpstreamFault,
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
    # The reviewed input schemas of its tools, by tool, as for McpHttpUpstream.
    input_schemas: Path | None = None


@dataclass(frozen=True, slots=True)
class McpHttpUpstream:
    """An MCP server reached over streamable HTTP."""

    name: str
    # The environment variable that holds its endpoint's URL (such as https://host/mcp).
    url_env: str
    # The upstream tools its declarations call: each must be listed by the server.
    tools: tuple[str, ...]
    # The environment variable that holds its bearer token, if it takes one.
    token_env: str | None = None
    # Headers sent with every request (no secrets: those come from token_env).
    headers: tuple[tuple[str, str], ...] = ()
    # Where a write's idempotency key travels, if the server honours one: an argument of its
    # tools, or a field of the call's `_meta`. Where it takes none, each writing tool declares
    # the read that finds its effect by key (outcome_of), or Toolgate does not start.
    idempotency_argument: str | None = None
    idempotency_meta: str | None = None
    # The argument Toolgate fills on every call, and its value from the call's customer.
    injected_argument: str | None = None
    injected_value: Callable[[str], str] | None = None
    # The time budget of one call: to connect, and then to answer.
    timeout_seconds: float = 5.0
    # The reviewed input schemas of its tools, by tool (a JSON file beside the declaration):
    # what the drift check and every call compare the server's listing with.
    input_schemas: Path | None = None

    def __post_init__(self) -> None:
        if self.idempotency_argument and self.idempotency_meta:
            raise ValueError(f"upstream {self.name}: its key travels in one place, not two")
        if self.injected_argument and self.injected_argument == self.idempotency_argument:
            raise ValueError(f"upstream {self.name}: {self.injected_argument} is filled twice")

    @property
    def honours_idempotency_key(self) -> bool:
        return bool(self.idempotency_argument or self.idempotency_meta)


McpDeclaration = McpStdioUpstream | McpHttpUpstream


def reviewed_schemas(declared: McpDeclaration) -> dict[str, Any] | None:
    """The input schemas its tools were reviewed with, by tool, if the declaration names them."""
    path = declared.input_schemas
    if path is None:
        return None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: the reviewed input schemas are a JSON object, by tool")
    return loaded


# Schema keywords that say what a value is for, not which values pass.
_ANNOTATIONS = frozenset({"title", "description", "examples", "$comment"})
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def schema_drift(tool: str, reviewed: Any, current: Any) -> str | None:
    """How a tool's current input schema differs from the reviewed one where it decides which
    calls pass, or None: its properties named, never their contents."""
    before, after = _validating(reviewed), _validating(current)
    if before == after:
        return None
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return f"{tool}: its input schema changed"
    parts = []
    was, now = before.get("properties") or {}, after.get("properties") or {}
    for name in sorted(set(was) | set(now)):
        if name not in now:
            parts.append(f"{name} removed")
        elif name not in was:
            parts.append(f"{name} added")
        elif was[name] != now[name]:
            parts.append(name)
    if sorted(before.get("required") or []) != sorted(after.get("required") or []):
        parts.append("which are required")
    parts += sorted(
        key
        for key in set(before) | set(after)
        if key not in ("properties", "required") and before.get(key) != after.get(key)
    )
    return f"{tool}: its input schema changed ({upstream_words(', '.join(parts))})"


def _validating(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_validating(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _NAMED and isinstance(value, dict):
            # Its keys are names (of properties, of definitions), not keywords.
            kept[key] = {name: _validating(item) for name, item in value.items()}
        elif key not in _ANNOTATIONS:
            kept[key] = _validating(value)
    return kept


@dataclass
class McpUpstream:
    """An MCP server's declaration, connected on first use."""

    declared: McpDeclaration
    offered: frozenset[str] = field(default=frozenset(), init=False)
    # The declared tools the server no longer offers as reviewed, and how.
    changed: dict[str, str] = field(default_factory=dict, init=False)
    _schemas: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _current: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _relist: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stack: ExitStack | None = field(default=None, init=False, repr=False)
    _portal: BlockingPortal | None = field(default=None, init=False, repr=False)
    _session: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # Read at start-up: a missing or unreadable snapshot stops Toolgate, not a call.
        self._schemas = reviewed_schemas(self.declared)
        missing = sorted(set(self.declared.tools) - set(self._schemas or self.declared.tools))
        if missing:
            raise LookupError(
                f"upstream {self.name}: its reviewed input schemas lack {', '.join(missing)}"
            )

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def honours_idempotency_key(self) -> bool:
        declared = self.declared
        return isinstance(declared, McpHttpUpstream) and declared.honours_idempotency_key

    def call(
        self,
        tool: str,
        answer: type[Answer],
        arguments: Mapping[str, Any],
        *,
        customer_id: str,
        key: str | None = None,
    ) -> Answer:
        """Call one of the declared upstream tools for a customer; its answer as `answer`. A
        write passes its idempotency key, which travels where the declaration says."""
        if tool not in self.declared.tools:
            raise LookupError(f"upstream {self.name}: {tool!r} is not a declared tool")
        sent = dict(arguments)
        declared = self.declared
        injected = declared.injected_argument
        if injected is not None and declared.injected_value is not None:
            sent[injected] = declared.injected_value(customer_id)
        meta = None
        if key is not None and isinstance(declared, McpHttpUpstream):
            if declared.idempotency_argument:
                sent[declared.idempotency_argument] = key
            elif declared.idempotency_meta:
                meta = {declared.idempotency_meta: key}
        with self._lock:
            result = self._called(tool, sent, meta)
            text = "".join(getattr(part, "text", "") for part in getattr(result, "content", []))
            if getattr(result, "is_error", False):
                # A tool it no longer offers (or no longer as reviewed) is refused as such.
                self._listed_again()
                self._unchanged(tool)
                raise UpstreamRefusal(self.name, TOOL_ERROR, _error_words(text))
        structured = getattr(result, "structured_content", None)
        try:
            if structured is not None:
                return answer.model_validate(structured)
            return answer.model_validate_json(text)
        except ValidationError as error:
            where = sorted({".".join(map(str, e["loc"])) or e["type"] for e in error.errors()})
            fields = upstream_words(", ".join(where[:5]))
            if not any(e["type"] == "json_invalid" for e in error.errors()):
                # JSON of another shape: the tool's contract moved (not a garbled answer).
                drift_record(
                    upstream=self.name, tool=tool, kind=ANSWER_SHAPE, detail=f"fields {fields}"
                )
            raise UpstreamBadAnswer(
                self.name, f"its answer to {tool} does not match the declared shape ({fields})"
            ) from None

    def listed(self) -> frozenset[str]:
        """The tools the server lists now (connecting if need be)."""
        with self._lock:
            self._connected()
            self._listed_again()
            return self.offered

    def drift(self) -> list[str]:
        """How the server's tools differ from the declared and reviewed ones, listed now."""
        self.listed()
        return [self.changed[tool] for tool in self.declared.tools if tool in self.changed]

    def current_schemas(self) -> dict[str, Any]:
        """The input schemas of the declared tools as the server lists them now."""
        with self._lock:
            self._connected()
            self._listed_again()
            return {
                tool: self._current[tool] for tool in self.declared.tools if tool in self._current
            }

    def close(self) -> None:
        with self._lock:
            self._close()

    def _called(self, tool: str, sent: dict[str, Any], meta: dict[str, Any] | None) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, INVALID_REQUEST, REQUEST_TIMEOUT

        for attempt in (1, 2):
            session, portal = self._connected()
            if self._relist:
                self._listed_again()
            self._unchanged(tool)
            try:
                return portal.call(
                    functools.partial(
                        session.call_tool,
                        tool,
                        sent,
                        read_timeout_seconds=self.declared.timeout_seconds,
                        meta=meta,
                    )
                )
            except MCPError as error:
                code = error.code
                if code == INVALID_REQUEST and attempt == 1:
                    # Not taken as a request: its session is gone (the server started again,
                    # or forgot it). Sent once more, on a new session.
                    self._log(tool, "session refused")
                    self._close()
                    continue
                if code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                    self._log(tool, "no answer")
                    self._close()
                    raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
                if code == INVALID_PARAMS:
                    raise UpstreamRefusal(
                        self.name, TOOL_ERROR, upstream_words(error.message) or "it refused"
                    ) from None
                # Any other error answer: the request was not carried out.
                self._log(tool, f"error {code}")
                raise UpstreamFailed(self.name, "it answered with an error") from None
            except RuntimeError as error:
                if "structured content" not in str(error):
                    raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
                # The SDK found its answer unlike the output schema the server lists.
                raise UpstreamBadAnswer(
                    self.name, f"its answer to {tool} does not match its own schema"
                ) from None
            except Exception as error:
                # A timeout, or the process or connection gone: the request may have been taken.
                self._log(tool, type(error).__name__)
                self._close()
                raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
        raise UpstreamDown(self.name, "it could not be reached")

    def _unchanged(self, tool: str) -> None:
        if tool in self.changed:
            raise UpstreamChanged(self.name, self.changed[tool])

    def _listed_again(self) -> None:
        session, portal = self._connected()
        self._relist = False
        try:
            listed = portal.call(session.list_tools)
        except Exception as error:
            self._log("tools/list", type(error).__name__)
            self._close()
            raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
        self._listing(listed.tools)

    def _listing(self, tools: list[Any]) -> None:
        schemas = {tool.name: tool.input_schema for tool in tools}
        if self._schemas is None:
            # No reviewed snapshot: the first listing is what later ones are compared with.
            self._schemas = {name: schemas[name] for name in self.declared.tools if name in schemas}
        changed = {}
        for name in self.declared.tools:
            if name not in schemas:
                changed[name] = f"{name}: no longer offered"
            elif name in self._schemas:
                found = schema_drift(name, self._schemas[name], schemas[name])
                if found is not None:
                    changed[name] = found
        for name, how in changed.items():
            if self.changed.get(name) != how:
                drift_record(
                    upstream=self.name,
                    tool=name,
                    kind=TOOL_MISSING if name not in schemas else INPUT_SCHEMA,
                    detail=how,
                )
        self.offered, self.changed, self._current = frozenset(schemas), changed, schemas

    def _connected(self) -> tuple[Any, BlockingPortal]:
        if self._session is not None and self._portal is not None:
            return self._session, self._portal
        from mcp import ClientSession

        stack = ExitStack()
        try:
            portal = stack.enter_context(start_blocking_portal())
            streams: AbstractContextManager[Any] = portal.wrap_async_context_manager(
                self._streams()
            )
            read, write = stack.enter_context(streams)[:2]
            session = stack.enter_context(
                portal.wrap_async_context_manager(
                    ClientSession(
                        read,
                        write,
                        read_timeout_seconds=self._connect_seconds(),
                        message_handler=self._notified,
                    )
                )
            )
            portal.call(session.initialize)
            listed = portal.call(session.list_tools)
        except UpstreamFault:
            self._closed(stack)
            raise
        except Exception as error:
            self._closed(stack)
            logger.warning("upstream %s: could not connect (%s)", self.name, type(error).__name__)
            raise UpstreamDown(self.name, "it could not be reached") from None
        self._stack, self._portal, self._session = stack, portal, session
        self._relist = False
        self._listing(listed.tools)
        return session, portal

    def _connect_seconds(self) -> float | None:
        # A server started here may take its time to start; one elsewhere answers in the budget.
        return self.declared.timeout_seconds if isinstance(self.declared, McpHttpUpstream) else None

    def _streams(self) -> Any:
        declared = self.declared
        if isinstance(declared, McpHttpUpstream):
            return _http_streams(declared)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        command = list(declared.command)
        if command and command[0] == "python":
            command[0] = sys.executable
        env = {name: os.environ[name] for name in declared.env if name in os.environ}
        return stdio_client(StdioServerParameters(command=command[0], args=command[1:], env=env))

    async def _notified(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if method == "notifications/tools/list_changed":
            # Listed again before the next call: this runs on the connection's own thread.
            self._relist = True

    def _log(self, what: str, how: str) -> None:
        # The tool and the kind of failure only: what the server said may carry anything.
        logger.warning("upstream %s: %s %s", self.name, what, how)

    def _close(self) -> None:
        stack, self._stack, self._portal, self._session = self._stack, None, None, None
        if stack is not None:
            self._closed(stack)

    def _closed(self, stack: ExitStack) -> None:
        try:
            stack.close()
        except Exception:  # the process or the connection is gone already
            logger.info("upstream %s: closed", self.name)


@asynccontextmanager
async def _http_streams(declared: McpHttpUpstream) -> AsyncIterator[Any]:
    """The streams of a streamable HTTP connection, its credentials from the environment."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    url = os.environ.get(declared.url_env, "")
    if not url:
        raise UpstreamDown(declared.name, "its address is not configured")
    headers = dict(declared.headers)
    if declared.token_env is not None:
        token = os.environ.get(declared.token_env, "")
        if not token:
            raise UpstreamDown(declared.name, "its credentials are not configured")
        headers["Authorization"] = f"Bearer {token}"
    seconds = declared.timeout_seconds
    # No read limit on the connection: each call's own budget bounds its answer, and the
    # server's stream of notifications may stay quiet for long.
    timeout = httpx2.Timeout(seconds, read=None)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(url, http_client=client, terminate_on_close=True) as streams,
    ):
        yield streams


def _error_words(text: str) -> str:
    try:
        loaded = json.loads(text)
    except ValueError:
        return upstream_words(text) or "it refused"
    if isinstance(loaded, Mapping):
        loaded = loaded.get("parsed_content", loaded.get("error", loaded))
    return upstream_words(loaded) or "it refused"

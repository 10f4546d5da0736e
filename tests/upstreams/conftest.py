"""The payments upstream in a process of its own, and its tools registered for a test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import urllib3

from dispatch.registry import tool_registry
from upstreams.registry import upstream_register, upstream_unregister

TOKEN = "pay-secret-7f3a9c1e5b"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class PaymentsServer:
    state_file: Path
    honours_idempotency_key: bool
    port: int = 0
    # The OpenAPI document it serves, if not the reviewed one.
    openapi: Path | None = None
    process: subprocess.Popen[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "tests.upstreams.payments_server"]
        if not self.honours_idempotency_key:
            command.append("--ignore-idempotency")
        if self.openapi is not None:
            command += ["--openapi", str(self.openapi)]
        return command

    def start(self) -> None:
        command = self.command()
        command += ["--state", str(self.state_file), "--token", TOKEN, "--port", str(self.port)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("PORT "), line
        self.port = int(line.split()[1])

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        response = urllib3.request(
            method,
            self.url + path,
            body=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
            retries=False,
        )
        return response.json()

    def arm(self, **faults: float | str) -> None:
        self._request("POST", "/_faults", faults)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state

    def refunds(self) -> list[dict[str, Any]]:
        return list(self.state()["refunds"])


@dataclass
class McpPaymentsServer(PaymentsServer):
    """The payments MCP server over streamable HTTP; `key` is where it takes an idempotency key
    (none, meta or argument)."""

    key: str = "none"

    @property
    def endpoint(self) -> str:
        return f"{self.url}/mcp"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.upstreams.payments_mcp_server", "--key", self.key]


@pytest.fixture(params=["meta", "none"], ids=["honours-key", "ignores-key"])
def payments_mcp(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[McpPaymentsServer]:
    """The payments MCP server, taking the key in its `_meta` or not at all, its tools
    registered."""
    yield from mcp_registered(tmp_path, monkeypatch, request.param)


def mcp_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: Literal["none", "meta", "argument"]
) -> Iterator[McpPaymentsServer]:
    from tests.upstreams import payments_mcp as declarations

    server = McpPaymentsServer(tmp_path / "payments.json", key != "none", key=key)
    server.start()
    monkeypatch.setenv("TOOLGATE_UPSTREAM_PAYMENTS_MCP_URL", server.endpoint)
    monkeypatch.setenv("TOOLGATE_UPSTREAM_PAYMENTS_MCP_TOKEN", TOKEN)
    monkeypatch.setattr(declarations, "UPSTREAM", declarations.payments_mcp_upstream(key=key))
    try:
        upstream_register(declarations, tool_registry)
        try:
            yield server
        finally:
            upstream_unregister("payments_mcp", tool_registry)
    finally:
        server.kill()


def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, honours_idempotency_key: bool
) -> Iterator[PaymentsServer]:
    server = PaymentsServer(tmp_path / "payments.json", honours_idempotency_key)
    server.start()
    monkeypatch.setenv("TOOLGATE_UPSTREAM_PAYMENTS_URL", server.url)
    monkeypatch.setenv("TOOLGATE_UPSTREAM_PAYMENTS_TOKEN", TOKEN)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(params=[True, False], ids=["honours-key", "ignores-key"])
def payments(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PaymentsServer]:
    """The payments upstream, in each of its variants, with its tools registered."""
    honours = bool(request.param)
    yield from _registered(tmp_path, monkeypatch, honours)


@pytest.fixture
def payments_honouring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PaymentsServer]:
    yield from _registered(tmp_path, monkeypatch, True)


def _registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, honours: bool
) -> Iterator[PaymentsServer]:
    from tests.upstreams import payments as declarations

    monkeypatch.setattr(
        declarations,
        "UPSTREAM",
        declarations.payments_upstream(honours_idempotency_key=honours),
    )
    for server in serve(tmp_path, monkeypatch, honours_idempotency_key=honours):
        upstream_register(declarations, tool_registry)
        try:
            yield server
        finally:
            upstream_unregister("payments", tool_registry)


def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.02)


os.environ.setdefault("TOOLGATE_UPSTREAM_PAYMENTS_TIMEOUT", "2")

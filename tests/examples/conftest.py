"""A model provider on 127.0.0.1 that answers from a script (stdlib http.server in a thread).

The provider is the edge the product does not own, and this machine cannot reach it: each canned
answer is written in the shape the provider documents and checked against its SDK's own type,
and each request the example sends is checked against the SDK's own request type.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

# The ports this suite's servers may use.
PORTS = range(18_100, 18_200)


def documented(model: BaseModel) -> None:
    """Fail on any field the SDK's type does not name, at any depth (its models allow extras)."""
    assert not model.model_extra, f"{type(model).__name__}: undocumented {model.model_extra}"
    for name in type(model).model_fields:
        _documented_value(getattr(model, name))


def _documented_value(value: Any) -> None:
    if isinstance(value, BaseModel):
        documented(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _documented_value(item)


@dataclass
class FakeProvider:
    """Answers POSTs to `path` with `answers`, in order; keeps every request body it got."""

    path: str
    # Checks one request body against the SDK's request type; raises if it does not fit.
    check_request: Callable[[Mapping[str, Any]], None]
    answers: deque[dict[str, Any]] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    url: str = ""

    def answer(self, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, Any]:
        if path != self.path:
            self.problems.append(f"unexpected path {path}")
            return 404, {"error": {"message": f"no {path} here"}}
        document = json.loads(body)
        self.requests.append(document)
        self.headers.append({name.lower(): value for name, value in headers.items()})
        try:
            self.check_request(document)
        except (ValidationError, AssertionError) as exc:
            self.problems.append(f"request {len(self.requests)} does not fit the SDK: {exc}")
            return 400, {"error": {"type": "invalid_request_error", "message": str(exc)[:500]}}
        if not self.answers:
            self.problems.append(f"request {len(self.requests)} came after the script ended")
            return 400, {"error": {"type": "invalid_request_error", "message": "script ended"}}
        return 200, self.answers.popleft()


def typed_dict_check(request_type: Any, *iterables: str) -> Callable[[Mapping[str, Any]], None]:
    """A check of a body against one of the SDK's TypedDicts of request parameters. Its Iterable
    fields are validated as they are read, so they are read here."""
    adapter = TypeAdapter(request_type)

    def check(body: Mapping[str, Any]) -> None:
        validated = adapter.validate_python(body)
        for name in iterables:
            list(validated.get(name) or ())

    return check


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, document = provider.answer(self.path, body, dict(self.headers.items()))
            payload = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _bind(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    for port in PORTS:
        try:
            return ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            continue
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


ServeProvider = Callable[[FakeProvider], FakeProvider]


@pytest.fixture
def serve_provider() -> Iterator[ServeProvider]:
    servers: list[ThreadingHTTPServer] = []

    def serve(provider: FakeProvider) -> FakeProvider:
        server = _bind(_handler(provider))
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        provider.url = f"http://127.0.0.1:{server.server_address[1]}"
        return provider

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()

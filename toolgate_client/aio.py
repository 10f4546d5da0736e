"""The agent API v1 for asyncio hosts: the same operations as `Toolgate`, awaited.

    from toolgate_client.aio import AsyncToolgate

    async with AsyncToolgate(url, token, customer_id="CUS-1") as toolgate:
        result = await toolgate.call("refund_order", model_arguments_text)
        if result.held:
            final = await toolgate.wait(result.confirmation_id)

It needs `httpx` (`pip install 'toolgate[async]'`); the sync client does not.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from toolgate_client.envelope import (
    answer_document,
    call_envelope,
    error_from,
    request_headers,
    timed_out,
    unreachable,
)
from toolgate_client.types import (
    CallResult,
    Confirmation,
    WaitTimeoutError,
)


class AsyncToolgate:
    """One agent's client on asyncio: its token, and the session and customer its host vouches
    for. Every pipeline outcome is a CallResult; anything else the API answers is raised as a
    ToolgateError, as the sync client does. Waiting never blocks the event loop."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        session_id: str | None = None,
        customer_id: str | None = None,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.session_id = session_id or f"py-{uuid.uuid4().hex}"
        self.customer_id = customer_id
        self.timeout = timeout
        self.http = http or httpx.AsyncClient()

    async def __aenter__(self) -> AsyncToolgate:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # The operations -------------------------------------------------------------------------

    async def tools(self, format: str | None = None) -> list[dict[str, Any]]:
        """The tools this agent may call: Toolgate's own shape, or "openai" (Chat Completions),
        "responses" (the Responses API) or "anthropic"."""
        params = {"format": format} if format else None
        document = await self._json("GET", "/api/v1/tools", params=params)
        listed: list[dict[str, Any]] = document["tools"]
        return listed

    async def codes(self) -> list[dict[str, Any]]:
        """The catalogue of result codes, with their meaning and whether a model can fix them."""
        codes: list[dict[str, Any]] = (await self._json("GET", "/api/v1/codes"))["codes"]
        return codes

    async def call(
        self,
        tool: str,
        arguments: Any,
        *,
        session_id: str | None = None,
        customer_id: str | None = None,
        context: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallResult:
        """Send one tool call as the model produced it: its raw argument text, or the JSON value
        the host parsed from it."""
        envelope = call_envelope(
            tool,
            arguments,
            session_id=session_id or self.session_id,
            customer_id=customer_id or self.customer_id,
            context=context,
        )
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        document = await self._json("POST", "/api/v1/calls", json=envelope, headers=headers)
        return CallResult.from_json(document)

    async def confirmation(self, confirmation_id: str) -> Confirmation:
        document = await self._json("GET", f"/api/v1/confirmations/{confirmation_id}")
        return Confirmation.from_json(document)

    async def wait(
        self,
        confirmation_id: str,
        *,
        timeout: float = 600.0,
        interval: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> Confirmation:
        """Poll a held call until it is final (executed, rejected, ...), yielding to the loop
        between polls; WaitTimeoutError if not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            confirmation = await self.confirmation(confirmation_id)
            if confirmation.final:
                return confirmation
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeoutError(confirmation, timeout)
            await sleep(min(interval, left))

    async def session_calls(self, session_id: str | None = None) -> dict[str, Any]:
        """The first page of this agent's calls in a session (this client's, by default)."""
        return await self._json("GET", f"/api/v1/sessions/{session_id or self.session_id}/calls")

    # HTTP -----------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The raw response, whatever its status, and httpx's own exceptions: for what the
        typed methods do not cover."""
        sent = request_headers(self.token, has_body=json is not None or bool(data), extra=headers)
        return await self.http.request(
            method,
            f"{self.base_url}{path}",
            json=json,
            content=data,
            params=params,
            headers=sent,
            timeout=self.timeout,
        )

    async def _json(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        try:
            response = await self.request(method, path, **options)
        except httpx.TimeoutException:
            raise timed_out(self.base_url, self.timeout) from None
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from None
        try:
            document = response.json()
        except ValueError:
            document = None
        answer = answer_document(response.status_code, document)
        if answer is not None:
            return answer
        raise error_from(
            status=response.status_code,
            method=response.request.method,
            url=str(response.url),
            retry_after=response.headers.get("Retry-After"),
            document=document,
        )

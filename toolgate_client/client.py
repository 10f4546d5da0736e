"""The agent API v1 over HTTP, for agent hosts written in Python."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import requests

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
    ToolgateError,
    WaitTimeoutError,
)


class Toolgate:
    """One agent's client: its token, and the session and customer its host vouches for.

    `call()` answers every pipeline outcome with a CallResult (check `ok`, hand `model_text` to
    the model); anything else the API answers is raised as a ToolgateError.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        session_id: str | None = None,
        customer_id: str | None = None,
        timeout: float = 30.0,
        http: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.session_id = session_id or f"py-{uuid.uuid4().hex}"
        self.customer_id = customer_id
        self.timeout = timeout
        self.http = http or requests.Session()

    def __enter__(self) -> Toolgate:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # The operations -------------------------------------------------------------------------

    def tools(self, format: str | None = None) -> list[dict[str, Any]]:
        """The tools this agent may call: Toolgate's own shape, or "openai" (Chat Completions),
        "responses" (the Responses API) or "anthropic"."""
        params = {"format": format} if format else None
        listed: list[dict[str, Any]] = self._json("GET", "/api/v1/tools", params=params)["tools"]
        return listed

    def codes(self) -> list[dict[str, Any]]:
        """The catalogue of result codes, with their meaning and whether a model can fix them."""
        codes: list[dict[str, Any]] = self._json("GET", "/api/v1/codes")["codes"]
        return codes

    def call(
        self,
        tool: str,
        arguments: Any,
        *,
        session_id: str | None = None,
        customer_id: str | None = None,
        context: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallResult:
        """Send one tool call as the model produced it: its raw argument text (best: Toolgate
        judges the text itself), or the JSON value the host parsed from it."""
        envelope = call_envelope(
            tool,
            arguments,
            session_id=session_id or self.session_id,
            customer_id=customer_id or self.customer_id,
            context=context,
        )
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        document = self._json("POST", "/api/v1/calls", json=envelope, headers=headers)
        return CallResult.from_json(document)

    def confirmation(self, confirmation_id: str) -> Confirmation:
        document = self._json("GET", f"/api/v1/confirmations/{confirmation_id}")
        return Confirmation.from_json(document)

    def wait(
        self,
        confirmation_id: str,
        *,
        timeout: float = 600.0,
        interval: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Confirmation:
        """Poll a held call until it is final (executed, rejected, ...); WaitTimeoutError if not
        within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            confirmation = self.confirmation(confirmation_id)
            if confirmation.final:
                return confirmation
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeoutError(confirmation, timeout)
            sleep(min(interval, left))

    def session_calls(self, session_id: str | None = None) -> dict[str, Any]:
        """The first page of this agent's calls in a session (this client's, by default)."""
        return self._json("GET", f"/api/v1/sessions/{session_id or self.session_id}/calls")

    # HTTP -----------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """The raw response, whatever its status, and requests' own exceptions: for what the
        typed methods do not cover."""
        sent = request_headers(self.token, has_body=json is not None or bool(data), extra=headers)
        return self.http.request(
            method,
            f"{self.base_url}{path}",
            json=json,
            data=data,
            params=params,
            headers=sent,
            timeout=self.timeout,
        )

    def _json(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        try:
            response = self.request(method, path, **options)
        except requests.Timeout:
            raise timed_out(self.base_url, self.timeout) from None
        except requests.ConnectionError as exc:
            raise unreachable(self.base_url, exc) from None
        try:
            document = response.json()
        except ValueError:
            document = None
        answer = answer_document(response.status_code, document)
        if answer is not None:
            return answer
        raise error_of(response, document)


def error_of(response: requests.Response, document: Any) -> ToolgateError:
    """The exception for an answer that is not a 200 with JSON: the envelope's own words."""
    return error_from(
        status=response.status_code,
        method=str(response.request.method),
        url=response.url,
        retry_after=response.headers.get("Retry-After"),
        document=document,
    )

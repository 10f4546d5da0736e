"""An HTTP upstream: an API Toolgate gates but does not host, described by its OpenAPI document.

Its declaration (HttpUpstream) is code in the repository, reviewed like code; where it is and
the credentials it takes come from the environment, read at each call and never written
anywhere. The operations its tools use are found in the reviewed OpenAPI document when it is
declared: a declaration that names an operation the document does not offer fails at start-up.

Every answer is read within the declaration's time budget and at most MAX_ANSWER_BYTES, parsed
as the declared pydantic model of that operation, and anything the upstream says is shown only
as escaped, shortened words (upstream_words). What went wrong is one of UpstreamFault's kinds,
each saying whether the request may have taken effect.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from pydantic import BaseModel, ValidationError

from upstreams.drift_records import ANSWER_SHAPE, drift_record

logger = logging.getLogger(__name__)

Answer = TypeVar("Answer", bound=BaseModel)

MAX_ANSWER_BYTES = 1_000_000
# How much of what an upstream says a message repeats.
MAX_WORDS = 200
IDEMPOTENCY_HEADER = "Idempotency-Key"
_METHODS = ("get", "put", "post", "delete", "patch")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class UpstreamFault(Exception):
    """An upstream call that did not give a usable answer. `may_have_happened`: the request may
    have reached the upstream and taken effect (no answer came back)."""

    may_have_happened = False

    def __init__(self, upstream: str, words: str) -> None:
        super().__init__(f"{upstream}: {words}")
        self.upstream = upstream
        self.words = words


class UpstreamDown(UpstreamFault):
    """The request was certainly not taken: no connection, or no credentials configured."""


class UpstreamNoAnswer(UpstreamFault):
    """The request was sent and no answer came back in time, or the connection dropped."""

    may_have_happened = True


class UpstreamFailed(UpstreamFault):
    """The upstream answered with a server error (5xx): it says nothing was done."""


class UpstreamRefusal(UpstreamFault):
    """The upstream refused the request (4xx); `words` are its reason, escaped."""

    def __init__(self, upstream: str, status: int, words: str) -> None:
        super().__init__(upstream, words)
        self.status = status


class UpstreamBadAnswer(UpstreamFault):
    """A success whose body is not JSON, or not the declared answer's shape."""


class UpstreamChanged(UpstreamFault):
    """The upstream no longer offers the tool as it was reviewed (removed, or its input schema
    changed): the request was not sent."""


def upstream_words(text: object) -> str:
    """What an upstream said, fit to repeat to a model or on a page: control characters out,
    at most MAX_WORDS characters, markup escaped."""
    flat = _CONTROL.sub(" ", str(text)).strip()
    if len(flat) > MAX_WORDS:
        flat = flat[: MAX_WORDS - 1] + "…"
    return html.escape(flat, quote=True)


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the document: how it is called."""

    operation_id: str
    method: str
    path: str
    # The operation as the document describes it (parameters, request body, responses): what
    # the drift check compares.
    described: Mapping[str, Any]


def openapi_operations(document: Mapping[str, Any]) -> dict[str, Operation]:
    """The operations an OpenAPI document offers, by operationId."""
    operations: dict[str, Operation] = {}
    for path, item in (document.get("paths") or {}).items():
        for method in _METHODS:
            described = item.get(method) if isinstance(item, Mapping) else None
            if isinstance(described, Mapping) and described.get("operationId"):
                name = str(described["operationId"])
                operations[name] = Operation(name, method.upper(), str(path), described)
    return operations


@dataclass(frozen=True, slots=True)
class HttpUpstream:
    """An HTTP API's declaration."""

    name: str
    # The OpenAPI document as reviewed, in the repository.
    openapi: Path
    # The operations (operationIds) its tools call: each must be in the document.
    operations: tuple[str, ...]
    # The environment variables that hold its base URL and its bearer token.
    url_env: str
    token_env: str | None = None
    # Whether it makes a request sent again with the same Idempotency-Key take effect once.
    # Where it does not, each writing tool declares the read that finds its effect by key.
    honours_idempotency_key: bool = False
    # The time budget of one request: to connect, and then to answer.
    timeout_seconds: float = 5.0
    # Where it serves its current OpenAPI document (for the drift check).
    openapi_path: str = "/openapi.json"

    def document(self) -> dict[str, Any]:
        loaded = json.loads(self.openapi.read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            raise ValueError(f"{self.openapi}: an OpenAPI document is a JSON object")
        return loaded


@dataclass
class Upstream:
    """An HttpUpstream, connected: its tools read and write through it."""

    declared: HttpUpstream
    operations: dict[str, Operation] = field(init=False)
    _pool: urllib3.PoolManager = field(init=False, repr=False)

    def __post_init__(self) -> None:
        offered = openapi_operations(self.declared.document())
        missing = [name for name in self.declared.operations if name not in offered]
        if missing:
            raise LookupError(
                f"upstream {self.name}: its OpenAPI document offers no operation "
                f"{', '.join(map(repr, missing))} (it offers {', '.join(sorted(offered))})"
            )
        # Only what the declaration names is ever called.
        self.operations = {name: offered[name] for name in self.declared.operations}
        seconds = self.declared.timeout_seconds
        self._pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=8,
            retries=False,
            timeout=urllib3.Timeout(connect=seconds, read=seconds),
        )

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def honours_idempotency_key(self) -> bool:
        return self.declared.honours_idempotency_key

    def operation(self, operation_id: str) -> Operation:
        found = self.operations.get(operation_id)
        if found is None:
            raise LookupError(f"upstream {self.name}: {operation_id!r} is not a declared operation")
        return found

    def read(
        self,
        operation_id: str,
        answer: type[Answer],
        *,
        path: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        missing: bool = False,
    ) -> Answer | None:
        """Call a reading operation; its answer as `answer`. With `missing`, a 404 is None."""
        try:
            return self.call(operation_id, answer, path=path, query=query)
        except UpstreamRefusal as refusal:
            if missing and refusal.status == 404:
                return None
            raise

    def write(
        self,
        operation_id: str,
        answer: type[Answer],
        *,
        key: str,
        path: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Answer:
        """Call a writing operation under the call's idempotency key, which travels as the
        Idempotency-Key header (an upstream that does not honour it ignores it)."""
        return self.call(operation_id, answer, path=path, body=body, key=key)

    def call(
        self,
        operation_id: str,
        answer: type[Answer],
        *,
        path: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> Answer:
        operation = self.operation(operation_id)
        url = self._url(operation, path or {}, query or {})
        headers = {"Accept": "application/json", **self._credentials()}
        encoded = None
        if body is not None:
            encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers[IDEMPOTENCY_HEADER] = key
        status, raw = self._send(operation, url, headers, encoded)
        if status >= 500:
            raise UpstreamFailed(self.name, f"it answered HTTP {status}")
        if status >= 400:
            raise UpstreamRefusal(self.name, status, self._reason(raw, status))
        if not 200 <= status < 300:
            raise UpstreamBadAnswer(self.name, f"it answered HTTP {status}")
        try:
            return answer.model_validate_json(raw)
        except ValidationError as error:
            # Which fields, never their values: the answer may hold what must not be repeated.
            where = sorted({".".join(map(str, e["loc"])) or e["type"] for e in error.errors()})
            fields = upstream_words(", ".join(where[:5]))
            if not any(e["type"] == "json_invalid" for e in error.errors()):
                # JSON of another shape: the upstream's contract moved (not a garbled answer).
                drift_record(
                    upstream=self.name,
                    tool=operation_id,
                    kind=ANSWER_SHAPE,
                    detail=f"fields {fields}",
                )
            raise UpstreamBadAnswer(
                self.name,
                f"its answer to {operation_id} does not match the declared shape ({fields})",
            ) from None

    def _url(self, operation: Operation, path: Mapping[str, str], query: Mapping[str, str]) -> str:
        base = os.environ.get(self.declared.url_env, "").rstrip("/")
        if not base:
            raise UpstreamDown(self.name, "its address is not configured")
        filled = operation.path
        for name, value in path.items():
            filled = filled.replace("{" + name + "}", quote(str(value), safe=""))
        return base + filled + (f"?{urlencode(query)}" if query else "")

    def _credentials(self) -> dict[str, str]:
        if self.declared.token_env is None:
            return {}
        token = os.environ.get(self.declared.token_env, "")
        if not token:
            raise UpstreamDown(self.name, "its credentials are not configured")
        return {"Authorization": f"Bearer {token}"}

    def _send(
        self, operation: Operation, url: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        try:
            response = self._pool.urlopen(
                operation.method,
                url,
                body=body,
                headers=headers,
                redirect=False,
                preload_content=False,
            )
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError):
            self._log(operation, "could not connect")
            raise UpstreamDown(self.name, "it could not be reached") from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            self._log(operation, type(error).__name__)
            raise UpstreamNoAnswer(self.name, "it did not answer in time") from None
        try:
            raw = response.read(MAX_ANSWER_BYTES + 1)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            self._log(operation, type(error).__name__)
            raise UpstreamNoAnswer(self.name, "its answer was cut off") from None
        finally:
            response.release_conn()
        if len(raw) > MAX_ANSWER_BYTES:
            raise UpstreamBadAnswer(self.name, "its answer is larger than Toolgate reads")
        return int(response.status), raw

    def _reason(self, raw: bytes, status: int) -> str:
        try:
            loaded = json.loads(raw)
        except ValueError:
            return f"HTTP {status}"
        message: object = loaded
        if isinstance(loaded, Mapping):
            error = loaded.get("error", loaded)
            message = error.get("message", error) if isinstance(error, Mapping) else error
        return upstream_words(message) or f"HTTP {status}"

    def _log(self, operation: Operation, what: str) -> None:
        # The operation and the kind of failure only: URLs and headers may carry credentials.
        logger.warning("upstream %s: %s %s", self.name, operation.operation_id, what)

    def current_document(self) -> dict[str, Any]:
        """The OpenAPI document the upstream serves now (the drift check's)."""
        base = os.environ.get(self.declared.url_env, "").rstrip("/")
        if not base or not urlsplit(base).scheme:
            raise UpstreamDown(self.name, "its address is not configured")
        operation = Operation("openapi", "GET", self.declared.openapi_path, {})
        status, raw = self._send(
            operation,
            base + operation.path,
            {"Accept": "application/json", **self._credentials()},
            None,
        )
        if status != 200:
            raise UpstreamBadAnswer(self.name, f"its OpenAPI document answered HTTP {status}")
        try:
            loaded = json.loads(raw)
        except ValueError:
            raise UpstreamBadAnswer(self.name, "its OpenAPI document is not JSON") from None
        if not isinstance(loaded, dict):
            raise UpstreamBadAnswer(self.name, "its OpenAPI document is not a JSON object")
        return loaded

"""A small client of Toolgate's agent API: tools(), call(), confirmation(), wait().

    from toolgate_client import Toolgate

    toolgate = Toolgate("http://127.0.0.1:8000", token, customer_id="CUS-1")
    result = toolgate.call("refund_order", model_arguments_text)
    if result.held:
        final = toolgate.wait(result.confirmation_id)

It depends on `requests` only, and on nothing else of the project. For asyncio hosts,
`toolgate_client.aio.AsyncToolgate` has the same operations, awaited, on `httpx`
(`pip install 'toolgate[async]'`).
"""

from toolgate_client.client import Toolgate
from toolgate_client.types import (
    FINAL_STATUSES,
    AuthenticationError,
    CallResult,
    Confirmation,
    ConflictError,
    ConnectionFailedError,
    MalformedRequestError,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    ThrottledError,
    ToolgateError,
    WaitTimeoutError,
)

__all__ = [
    "FINAL_STATUSES",
    "AuthenticationError",
    "CallResult",
    "Confirmation",
    "ConflictError",
    "ConnectionFailedError",
    "MalformedRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "ServerError",
    "ThrottledError",
    "Toolgate",
    "ToolgateError",
    "WaitTimeoutError",
]

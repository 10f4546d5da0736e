"""Agent hosts authenticate with `Authorization: Token <token>`, or `Bearer <token>` as MCP
clients and most configuration screens write it; the token maps to one agent."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from dispatch.auth_failures import (
    auth_failure_count,
    auth_failures_wait,
    token_known,
    token_seen_invalid,
    token_seen_valid,
    token_valid_here,
)
from dispatch.client_address import client_address
from dispatch.errors import AuthenticationThrottled, RateLimiterDown
from dispatch.models import Agent
from dispatch.services import agent_authenticate, token_hash
from dispatch.throttling import RateLimiterUnavailable, parse_rate, request_log


class AgentTokenAuthentication(BaseAuthentication):
    # The same static token under either scheme: `Token` is the API's own, `Bearer` what the MCP
    # authorization spec and client configurations send. No OAuth is behind `Bearer`.
    keywords = (b"token", b"bearer")
    refusal = "Invalid token, or the agent is disabled."

    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        return self.from_header(
            get_authorization_header(request), client_address(request._request) or None
        )

    def from_header(self, header: bytes, address: str | None = None) -> tuple[Any, str] | None:
        """The holder of the token in an Authorization header's value and the token; None when
        the header names another scheme or is empty. Also what the MCP server authenticates by.

        Failures are counted against the client's address (dispatch.auth_failures): past the
        rate, AuthenticationThrottled (429) is raised instead, and an unknown token is not even
        looked up.
        """
        parts = header.split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        token = parts[1].decode("ascii", "replace") if len(parts) == 2 else ""
        digest = token_hash(token)
        # A token this process saw work lately is not held back, and costs no round trip.
        if not (token and token_valid_here(digest)):
            wait = auth_failures_wait(address)
            if wait and not (token and token_known(digest)):
                raise AuthenticationThrottled(wait)
        if len(parts) != 2:
            self._failed(address, digest)
            raise AuthenticationFailed(
                "The Authorization header must be 'Token <token>' or 'Bearer <token>'."
            )
        if not parts[1].isascii():
            self._failed(address, digest)
            raise AuthenticationFailed("Invalid token.")
        holder = self.token_holder(token)
        if holder is None:
            self._failed(address, digest)
            raise AuthenticationFailed(self.refusal)
        token_seen_valid(digest)
        return holder, token

    @staticmethod
    def _failed(address: str | None, digest: str) -> None:
        # Counted before it is answered: a failure past the rate (requests that passed the check
        # above together) is a 429 like the rest, so no more than the rate are ever 401s.
        token_seen_invalid(digest)
        wait = auth_failure_count(address)
        if wait:
            raise AuthenticationThrottled(wait)

    def token_holder(self, token: str) -> Any:
        """Who the token belongs to (here an agent), or None."""
        return agent_authenticate(token)

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the header is missing.
        return "Token"


class IsAgent(BasePermission):
    # An agent made outside agent_create may have no policy yet, and without one it may do nothing.
    message = "This agent has no policy yet; an operator must give it one."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, Agent) and request.user.current_policy_id is not None


def agent_throttle_wait(agent: Agent) -> float:
    """Count one request of the agent: the seconds it must wait first, 0 if it may go ahead.

    The API and the MCP server count in the same place. Raises RateLimiterUnavailable.
    """
    # Read on every request, so that a changed setting (an override in a test, say) applies to
    # the very next request.
    limit, window = parse_rate(str(settings.TOOLGATE_AGENT_THROTTLE_RATE))
    return request_log().hit(f"throttle:agent:{agent.pk}", limit=limit, window_seconds=window)


class AgentRateThrottle(BaseThrottle):
    """TOOLGATE_AGENT_THROTTLE_RATE per agent, counted by dispatch.throttling across processes."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        if not isinstance(request.user, Agent):
            return True
        try:
            self._wait = agent_throttle_wait(request.user)
        except RateLimiterUnavailable:
            raise RateLimiterDown() from None
        return self._wait == 0

    def wait(self) -> float | None:
        return self._wait


class AgentTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = AgentTokenAuthentication
    name = "AgentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>` or `Bearer <token>`: the token printed once by "
            "`create_agent`.",
        }

"""Failed authentications, counted per client address so that a flood of bad tokens is cut short.

Every answer of 401 to a credential (a token that is wrong, malformed, or of a disabled agent or
user) and every 401 to a request with no credential at all counts against the client's address
(dispatch.client_address, through the trusted-proxy rule), in the same sliding log as the agent
throttle: Redis when it is the default cache, so that every web process counts in one place.
Past TOOLGATE_AUTH_FAILURE_RATE, a request of that address that carries a token is answered 429
before its token is looked up, unless that token was seen valid lately (AUTH_KNOWN_TOKEN_SECONDS):
so a flood from one address costs no database lookups, and cannot lock out an agent host that
shares the address and holds a good token. Successful authentications count nothing, and a
token the process itself saw work in the last few minutes skips the check (no round trip on the
hot path); if it fails it is forgotten, and each failure is counted, so past the rate it too is
answered 429 and no more 401s go out.

An IPv6 client is counted by its /64, the block one subscriber is usually given, so that stepping
through its own addresses does not reset the count.

If the shared log cannot be reached, authentication goes on as without this throttle (the agent
throttle answers 503 for the agent's own requests): a Redis outage must not refuse reviewers.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time

from django.conf import settings
from django.core.cache import cache

from dispatch.throttling import RateLimiterUnavailable, parse_rate, request_log

logger = logging.getLogger(__name__)

# The reason of the 429 past the rate, and of the one security event that says so.
THROTTLED_REASON = "authentication_throttled"
# The reason of a 401 to a request with no credential (DRF's, and the MCP server's).
NO_CREDENTIALS_REASON = "not_authenticated"

# A token that authenticated within this long is looked up even while its address is throttled.
AUTH_KNOWN_TOKEN_SECONDS = 3600
# Each process writes a token's mark at most this often (one cache write per token and period,
# not one per request).
_KNOWN_TOKEN_REFRESH_SECONDS = 300
_KNOWN_TOKENS_KEPT = 10_000

_known_written: dict[str, float] = {}
_known_lock = threading.Lock()


def auth_failure_rate() -> tuple[int, int]:
    """The failures an address may make and the window, in seconds, they are counted over."""
    return parse_rate(str(settings.TOOLGATE_AUTH_FAILURE_RATE))


def address_key(address: str) -> str:
    """What an address is counted under: itself, or an IPv6 address's /64."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


def _log_key(address: str) -> str:
    return f"throttle:auth-failures:{address_key(address)}"


def auth_failures_wait(address: str | None) -> float:
    """The seconds until the address may fail again; 0 while it is within its rate."""
    if not address:
        return 0.0
    limit, window = auth_failure_rate()
    try:
        return request_log().wait(_log_key(address), limit=limit, window_seconds=window)
    except RateLimiterUnavailable as exc:
        logger.warning("Failed authentications cannot be counted: %s", exc)
        return 0.0


def auth_failure_count(address: str | None) -> float:
    """Count one failed authentication of the address: 0 if it was within the rate, otherwise the
    seconds until the address may fail again (the failure is then not counted)."""
    if not address:
        return 0.0
    limit, window = auth_failure_rate()
    try:
        return request_log().hit(_log_key(address), limit=limit, window_seconds=window)
    except RateLimiterUnavailable as exc:
        logger.warning("Failed authentications cannot be counted: %s", exc)
        return 0.0


def auth_throttled_first(address: str | None) -> bool:
    """True once per address and window: for the one security event that says the address's
    failed authentications are past the rate and are no longer recorded one by one."""
    if not address:
        return False
    _, window = auth_failure_rate()
    try:
        return bool(cache.add(f"auth-throttled:{address_key(address)}", 1, timeout=window))
    except Exception as exc:
        logger.warning("Failed authentications cannot be counted: %s", exc)
        return True


def _known_key(digest: str) -> str:
    return f"auth-known:{digest}"


def token_known(digest: str) -> bool:
    """True if the token with this digest authenticated within AUTH_KNOWN_TOKEN_SECONDS."""
    try:
        return cache.get(_known_key(digest)) is not None
    except Exception as exc:
        logger.warning("Known tokens cannot be read: %s", exc)
        return False


def token_valid_here(digest: str) -> bool:
    """True if this process saw the token authenticate within the last few minutes: it passes
    the address's throttle anyway (as a known token), so the shared log need not be asked."""
    with _known_lock:
        written = _known_written.get(digest)
    return written is not None and time.monotonic() - written < _KNOWN_TOKEN_REFRESH_SECONDS


def token_seen_valid(digest: str) -> None:
    """Mark the token with this digest as having just authenticated."""
    now = time.monotonic()
    with _known_lock:
        written = _known_written.get(digest)
        if written is not None and now - written < _KNOWN_TOKEN_REFRESH_SECONDS:
            return
        if len(_known_written) >= _KNOWN_TOKENS_KEPT:
            _known_written.clear()
        _known_written[digest] = now
    try:
        cache.set(_known_key(digest), 1, timeout=AUTH_KNOWN_TOKEN_SECONDS)
    except Exception as exc:
        logger.warning("A known token cannot be marked: %s", exc)


def token_seen_invalid(digest: str) -> None:
    """Forget the token with this digest: it failed (its agent was disabled, say)."""
    with _known_lock:
        _known_written.pop(digest, None)
    try:
        cache.delete(_known_key(digest))
    except Exception as exc:
        logger.warning("A known token cannot be forgotten: %s", exc)

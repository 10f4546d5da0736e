"""Counting an agent's requests for its rate: a sliding log, in Redis or in this process.

A rate such as "6000/min" lets a request through while fewer than 6000 requests were let through
in the 60 seconds before it (the window slides with time, as DRF's cache throttle did, so no burst
of twice the rate fits across a window's edge). Refused requests are not counted.

With Redis as the default cache (django-redis: production insists on it), every web process counts
in the same sorted set per agent, and one Lua script prunes, counts and adds in one step: Redis
runs a script alone, so no two requests can both see room for one. Without Redis (the embedded
default, tests) each process counts alone under a lock, which is right only for one process.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

from django.core.cache import cache, caches
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection
from django_redis.cache import RedisCache
from redis.exceptions import RedisError

PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# KEYS[1]: the agent's log, a sorted set of request times in microseconds (Redis's own clock,
# so that web processes on several hosts agree). ARGV: the limit, the window in microseconds.
# Returns 0 when the request is let through, otherwise the microseconds until a place frees up.
_SLIDING_LOG = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
  -- The count keeps members apart when two requests share a microsecond.
  redis.call('ZADD', KEYS[1], now, time[1] .. '.' .. time[2] .. ':' .. count)
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tonumber(oldest[2]) + window - now
"""


# The same log, read without adding to it: 0 while it has room, otherwise the microseconds until
# a place frees up.
_SLIDING_LOG_WAIT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tonumber(oldest[2]) + window - now
"""


class RateLimiterUnavailable(Exception):
    """The shared counter could not be reached: nothing can say whether the agent has room."""


class RequestLog(Protocol):
    def hit(self, key: str, *, limit: int, window_seconds: int) -> float:
        """Count a request under key if it fits; returns 0, or the seconds to wait if not."""
        ...

    def wait(self, key: str, *, limit: int, window_seconds: int) -> float:
        """What hit would answer, without counting anything."""
        ...


class RedisRequestLog:
    """The log of every web process, in the default cache's Redis."""

    def hit(self, key: str, *, limit: int, window_seconds: int) -> float:
        return self._run(_SLIDING_LOG, key, limit, window_seconds)

    def wait(self, key: str, *, limit: int, window_seconds: int) -> float:
        return self._run(_SLIDING_LOG_WAIT, key, limit, window_seconds)

    def _run(self, source: str, key: str, limit: int, window_seconds: int) -> float:
        try:
            client = get_redis_connection("default")
            script = client.register_script(source)
            wait_us = script(keys=[cache.make_key(key)], args=[limit, window_seconds * 1_000_000])
        except RedisError as error:
            raise RateLimiterUnavailable(str(error)) from error
        return int(wait_us) / 1_000_000


class LocalRequestLog:
    """The log of this process only: the embedded default, where one process serves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, deque[float]] = {}

    def hit(self, key: str, *, limit: int, window_seconds: int) -> float:
        return self._count(key, limit, window_seconds, add=True)

    def wait(self, key: str, *, limit: int, window_seconds: int) -> float:
        return self._count(key, limit, window_seconds, add=False)

    def _count(self, key: str, limit: int, window_seconds: int, *, add: bool) -> float:
        now = time.monotonic()
        with self._lock:
            if not add and key not in self._logs:
                return 0.0
            log = self._logs.setdefault(key, deque())
            while log and log[0] <= now - window_seconds:
                log.popleft()
            if len(log) < limit:
                if add:
                    log.append(now)
                return 0.0
            return log[0] + window_seconds - now

    def clear(self) -> None:
        with self._lock:
            self._logs.clear()


local_request_log = LocalRequestLog()


def request_log() -> RequestLog:
    """Redis when it is the default cache, so that every process counts in one place."""
    if isinstance(caches["default"], RedisCache):
        return RedisRequestLog()
    return local_request_log


def parse_rate(rate: str) -> tuple[int, int]:
    """'6000/min' -> (6000, 60): the limit and the window in seconds."""
    count, _, period = rate.partition("/")
    try:
        limit = int(count)
        window = PERIODS[period.strip()[:1]]
    except (ValueError, KeyError):
        raise ImproperlyConfigured(
            f"A rate is a count per s, min, hour or day, such as '6000/min'; got {rate!r}."
        ) from None
    if limit < 1:
        raise ImproperlyConfigured(f"A rate lets at least one request through; got {rate!r}.")
    return limit, window

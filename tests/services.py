"""What a test does when a service it needs (PostgreSQL, Redis, nginx...) is not on this machine.

On a fresh machine it is skipped with the reason, so `make test` passes with no services. CI sets
TOOLGATE_REQUIRE_SERVICES=1, and there a missing service fails the test instead: a test that
silently skipped in CI would prove nothing.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def services_required() -> bool:
    return os.environ.get("TOOLGATE_REQUIRE_SERVICES", "") == "1"


def unavailable(reason: str) -> NoReturn:
    if services_required():
        pytest.fail(f"{reason} (TOOLGATE_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(reason)

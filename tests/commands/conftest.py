"""Running management commands as an operator does, and reading what they print."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any, Protocol

import pytest
from django.core.management import call_command


class Run(Protocol):
    def __call__(self, name: str, *args: str, **options: Any) -> str: ...


@pytest.fixture
def run() -> Run:
    """Run a command; returns its standard output (its standard error is discarded)."""

    def call(name: str, *args: str, **options: Any) -> str:
        out = StringIO()
        call_command(name, *args, stdout=out, stderr=StringIO(), no_color=True, **options)
        return out.getvalue()

    return call


def printed_token(output: str) -> str:
    match = re.search(r"^Token: (\S+)$", output, re.M)
    assert match is not None, output
    return match.group(1)

"""Amounts as people read them: see dispatch.money, the one place that formats and converts them."""

from __future__ import annotations

from dispatch.money import money

__all__ = ["money"]

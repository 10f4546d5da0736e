"""What a reviewer sees of a held call, as its tool declares it (ToolSpec.review and .words):
its subject and the facts worth a glance, and the words for its action. Plain values, which the
reviewer's pages format and render for any tool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class FactKind(enum.StrEnum):
    TEXT = "text"
    # An amount in minor units of the call's currency (or the review's, for a call that names
    # none), which the reviewer's pages format.
    MONEY = "money"
    # A moment, as an ISO 8601 text with its offset, which the reviewer's pages show as a date.
    DATE = "date"


class Fact(NamedTuple):
    """One thing a reviewer glances at before deciding (an order's total, what remains)."""

    label: str
    value: int | str
    kind: FactKind = FactKind.TEXT


@dataclass(frozen=True, slots=True)
class ReviewView:
    """What a reviewer sees of a held call's subject as it is now, as its domain words it."""

    # What the call is about, and its id: ("Order", "ORD-1001").
    subject_label: str
    subject: str
    # Whether the subject still exists for the call's customer; a missing one has no facts.
    found: bool = True
    facts: tuple[Fact, ...] = ()
    # The currency of its money facts where the call names none (one that moves no money).
    currency: str = ""


@dataclass(frozen=True, slots=True)
class ToolWords:
    """How people speak of a tool's action, in the pages and messages about its held calls; the
    tool's label names it in headings ("Refund order")."""

    # "a refund", "refunds": what is waiting, and what a duplicate would repeat.
    noun: str
    plural: str
    # "the most this agent may refund without a human", "already refunded to this customer".
    verb: str
    past: str

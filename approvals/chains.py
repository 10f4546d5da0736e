"""The chains of approvals' rows, for the audit's sealer and verifier (dispatch/audit.py): the
confirmation events, one chain per confirmation, and the policy events, one chain per agent (per
reviewer for approval limits)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from itertools import groupby

from approvals.models import ConfirmationEvent, PolicyEvent
from dispatch.audit import ChainSource
from dispatch.models import Confirmation
from dispatch.pipeline.audit_chain import (
    EVENT_FIELDS,
    POLICY_EVENT_FIELDS,
    Head,
    Link,
    covered,
    event_chain,
)

_CHUNK = 5000


def _count() -> int:
    return ConfirmationEvent.objects.count()


def _heads() -> dict[str, tuple[int, str]]:
    rows = Confirmation.objects.filter(event_seq__gt=0).values_list("pk", "event_seq", "event_head")
    return {event_chain(pk): (seq, head) for pk, seq, head in rows.iterator(chunk_size=_CHUNK)}


def _links() -> Iterator[tuple[str, Link]]:
    rows = (
        ConfirmationEvent.objects.order_by("confirmation_id", "chain_seq", "id")
        .values("id", "chain_seq", "chain_hash", "chain_mac", *EVENT_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    for row in rows:
        yield (
            event_chain(row["confirmation_id"]),
            Link(
                row["id"],
                row["chain_seq"],
                row["chain_hash"],
                covered(EVENT_FIELDS, row),
                row["chain_mac"],
            ),
        )


def _heads_since(since: datetime | None) -> Iterator[Head]:
    confirmations = Confirmation.objects.filter(event_seq__gt=0)
    if since is not None:
        # Few events a day (people's decisions): read by time, without an index of their own.
        moved = ConfirmationEvent.objects.filter(at__gte=since).values("confirmation_id")
        confirmations = confirmations.filter(pk__in=moved)
    rows = confirmations.values_list("pk", "event_seq", "event_head")
    for pk, seq, head in rows.iterator(chunk_size=_CHUNK):
        yield Head(event_chain(pk), seq, head)


confirmation_events = ChainSource(
    name="confirmation events",
    count=_count,
    heads=_heads,
    links=_links,
    heads_since=_heads_since,
)


def _policy_links() -> Iterator[tuple[str, Link]]:
    rows = (
        PolicyEvent.objects.order_by("chain", "chain_seq", "id")
        .values("id", "chain_seq", "chain_hash", "chain_mac", *POLICY_EVENT_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    for row in rows:
        yield (
            row["chain"],
            Link(
                row["id"],
                row["chain_seq"],
                row["chain_hash"],
                covered(POLICY_EVENT_FIELDS, row),
                row["chain_mac"],
            ),
        )


def _policy_heads_since(since: datetime | None) -> Iterator[Head]:
    # A chain's last event is its head; seals vouch for where it ends.
    events = PolicyEvent.objects.all()
    if since is not None:
        moved = PolicyEvent.objects.filter(at__gte=since).values("chain")
        events = events.filter(chain__in=moved)
    rows = events.order_by("chain", "-chain_seq").values_list("chain", "chain_seq", "chain_hash")
    for chain, links in groupby(rows.iterator(chunk_size=_CHUNK), key=lambda row: row[0]):
        _, seq, head = next(links)
        yield Head(chain, seq, head)


policy_events = ChainSource(
    name="policy events",
    count=PolicyEvent.objects.count,
    heads=None,
    links=_policy_links,
    heads_since=_policy_heads_since,
)

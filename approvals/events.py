"""A confirmation's row, locked in the order every decision takes, and its chained event log."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from approvals.errors import ConfirmationNotFound
from approvals.models import ConfirmationEvent, EventKind
from dispatch.audit_keys import audit_mac
from dispatch.held_money import decision_lock
from dispatch.models import Confirmation
from dispatch.pipeline.audit_chain import event_chain, link_hash

WORKER = "worker"
EXPIRY = "expiry"
# Who withdrew a held call: the agent's host.
HOST = "the agent's host"


def confirmation_locked(confirmation_id: str) -> Confirmation:
    """The confirmation's row, locked, after its customer's decision lock (dispatch.held_money
    gives the lock order)."""
    customer_id = (
        Confirmation.objects.filter(pk=confirmation_id)
        .values_list("customer_id", flat=True)
        .first()
    )
    if customer_id is None:
        raise ConfirmationNotFound(f"There is no confirmation {confirmation_id}.")
    decision_lock(customer_id=customer_id)
    return Confirmation.objects.select_for_update().get(pk=confirmation_id)


def event_append(
    confirmation: Confirmation,
    kind: str,
    actor: User | None,
    at: datetime,
    message: str = "",
    data: Mapping[str, Any] | None = None,
) -> None:
    """Append an event to the confirmation's log, as the next link of its chain: the head on the
    confirmation's row moves to it in the same transaction (compare-and-set; a decision holds the
    row's lock already, a worker's event may meet another's and links again)."""
    fields = {
        "confirmation_id": confirmation.pk,
        "at": at,
        "kind": kind,
        "actor_id": actor.pk if actor is not None else None,
        "actor_label": actor.get_username() if actor is not None else _label(kind),
        "message": message,
        "data": dict(data or {}),
    }
    chain = event_chain(confirmation.pk)
    seq, previous = confirmation.event_seq, confirmation.event_head
    with transaction.atomic(savepoint=False):
        for _ in range(_LINK_TRIES):
            linked = link_hash(chain=chain, seq=seq + 1, previous=previous, fields=fields)
            moved = Confirmation.objects.filter(pk=confirmation.pk, event_seq=seq).update(
                event_seq=seq + 1, event_head=linked
            )
            if moved:
                break
            seq, previous = (
                Confirmation.objects.filter(pk=confirmation.pk)
                .values_list("event_seq", "event_head")
                .get()
            )
        else:  # pragma: no cover - as many events as tries, all at once, on one confirmation
            raise RuntimeError(f"the event chain of {confirmation.pk} would not settle")
        ConfirmationEvent.objects.create(
            **fields, chain_seq=seq + 1, chain_hash=linked, chain_mac=audit_mac(linked)
        )
    confirmation.event_seq, confirmation.event_head = seq + 1, linked


# Each failed try means another event of the confirmation was appended in between.
_LINK_TRIES = 20


def _label(kind: str) -> str:
    if kind == EventKind.WITHDRAWN:
        return HOST
    return EXPIRY if kind == EventKind.EXPIRED else WORKER

"""The `Idempotency-Key` header of POST /api/v1/calls, with Stripe's semantics.

The pipeline's own idempotency key is derived from the session, so a host that restarts under a
new session id sends, as far as the pipeline can tell, a new call. A key the host chose and kept
ties the resent request to the first call instead:

- the same key (per agent) with the same request gets the final answer again, byte for byte,
  and the pipeline does not run;
- the same key with another request is refused (422, `idempotency_key_reused`);
- while a request with a key runs, another gets 409 `idempotency_key_in_progress`, retryable; a
  run whose process died is taken over once it is take_over_after() old.

"The same request" is the customer, the tool and the arguments as sent. The session id is left
out on purpose: a host that restarts starts a new conversation and a new session id, and resends
what it had not seen answered; comparing the session would turn the very case the key exists for
into an error. The customer is compared, so a key never returns another customer's answer.

An answer is final when sending the same call again cannot change it: a 200 whose result is not
retryable, whose code is not INTERNAL_ERROR and whose data does not say `"outcome": "unknown"`.
Only a final answer is kept against the key. Any other result (a retryable one, where nothing was
done; an INTERNAL_ERROR, where Toolgate failed; an unknown outcome, where the effect may have
happened) leaves the key unfinished, and the same request with it runs again in the session of
the key's first request, whatever session it names: there the pipeline's own key (agent,
session, tool, arguments) is the first call's, so a call whose outcome is unknown is finished
under it, once, rather than judged and run again as a new call. Its final answer is then kept.
Each run counts in that session's step budget and repeat limit as any call does: a key resent
past the limit gets LOOP_DETECTED, which is final.
An envelope error (400, 409, 500, ...) is no answer at all: it frees a new key altogether, and
leaves an unfinished one unfinished.

The key is claimed by inserting its row before the call runs, or by taking over an unfinished one
with a conditional update: either way one of two racing requests runs, whatever the interleaving,
and the other gets 409. The answer is written in the call's own transaction, so the effect and
the answer a resend gets commit together or not at all.

Keys are kept TOOLGATE_IDEMPOTENCY_KEY_HOURS (at least 24, Stripe's period) from their last run;
every PRUNE_EVERY-th new key deletes one batch of the expired ones, and `manage.py
prune_idempotency_keys` all of them.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from dispatch.errors import IdempotencyKeyInProgress, IdempotencyKeyReused
from dispatch.models import Agent, HostIdempotencyKey
from dispatch.pipeline import codes
from dispatch.pipeline.canonical import arguments_hash, canonical_json
from dispatch.pipeline.results import CallResult

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
# Printable ASCII, 1 to 255 characters, as Stripe takes it.
KEY_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")

# Far longer than any call takes (a call that writes is one short transaction; the gateway's
# retries last a second or two; gunicorn ends a request after 30 s): a key in progress for longer
# belongs to a process that died. TOOLGATE_IDEMPOTENCY_TAKE_OVER_SECONDS sets it (the default is
# this). Taking over a run that is in fact alive costs no money: its answer no longer settles the
# key (_settle), so it does not commit.
TAKE_OVER_AFTER = timedelta(seconds=60)


def take_over_after() -> timedelta:
    """How long a key may be in progress before another request takes its run over."""
    return timedelta(seconds=settings.TOOLGATE_IDEMPOTENCY_TAKE_OVER_SECONDS)


PRUNE_EVERY = 100
PRUNE_BATCH = 500

# What a result's data says when its effect may or may not have happened (stage 8).
UNKNOWN_OUTCOME = "unknown"


class Claim(NamedTuple):
    """This request runs the call, in `session_id`: the key's row, and the claim it must still
    hold to answer."""

    pk: int
    claimed_at: datetime
    session_id: str
    # A run before it left the key unfinished: if this one gives no answer either, the key stays
    # unfinished rather than free.
    resumed: bool = False


class Answer(NamedTuple):
    """The final answer to the key, to be given again."""

    status_code: int
    body: bytes


def request_hash(*, customer_id: str, tool: str, arguments: str | Mapping[str, Any]) -> str:
    """What two requests with one key must share; arguments as sent (an object in any key
    order, or the same text)."""
    return arguments_hash(
        canonical_json({"customer_id": customer_id, "tool": tool, "arguments": arguments})
    )


def answer_is_final(result: CallResult) -> bool:
    """Whether sending the same call again cannot change this answer (see the module's text)."""
    return not (
        result.retryable
        or result.code == codes.INTERNAL_ERROR.name
        or result.data.get("outcome") == UNKNOWN_OUTCOME
    )


def host_key_claim(
    *,
    agent: Agent,
    key: str,
    request_hash: str,
    session_id: str,
    now: datetime | None = None,
) -> Claim | Answer:
    """Claim the key for this request, named in `session_id`, or give the final answer to it.

    The claim names the session the call runs in: the key's first request's, once it has one.
    Raises IdempotencyKeyReused for another request, IdempotencyKeyInProgress while one runs.
    """
    now = now or timezone.now()
    # A row found and then gone (its run failed and freed it) is claimed again; twice at most.
    for _ in range(3):
        try:
            # A savepoint, so that losing the race does not break a transaction around it.
            with transaction.atomic():
                row = HostIdempotencyKey.objects.create(
                    agent=agent,
                    key=key,
                    request_hash=request_hash,
                    session_id=session_id,
                    created_at=now,
                    claimed_at=now,
                )
        except IntegrityError:
            pass
        else:
            _prune_now_and_then(row.pk, now)
            return Claim(row.pk, now, session_id)
        found = HostIdempotencyKey.objects.filter(agent=agent, key=key).first()
        if found is None:
            continue
        if found.request_hash != request_hash:
            raise IdempotencyKeyReused(
                f"The {HEADER} {_shown(key)} was first sent with another customer_id, tool or "
                "arguments; a key names one request. Use a new key for a new request."
            )
        if found.completed_at is not None and found.status_code is not None:
            return Answer(found.status_code, found.response_body.encode("utf-8"))
        if not found.unfinished and found.claimed_at > now - take_over_after():
            raise IdempotencyKeyInProgress()
        # Unfinished, or left running by a process that died: whichever request moves the claim
        # first runs; the other finds it running.
        taken = HostIdempotencyKey.objects.filter(
            pk=found.pk,
            completed_at=None,
            unfinished=found.unfinished,
            claimed_at=found.claimed_at,
        ).update(claimed_at=now, unfinished=False)
        if taken == 1:
            if not found.unfinished:
                logger.warning(
                    "Took over the %s of agent %s, in progress since %s",
                    HEADER,
                    agent.pk,
                    found.claimed_at.isoformat(),
                )
            # A key kept from before keys had sessions runs where this request says. One that
            # has an answer, not final since it was not kept, was left unfinished by a run.
            session = found.session_id or session_id
            return Claim(found.pk, now, session, resumed=found.status_code is not None)
    raise IdempotencyKeyInProgress()


def host_key_answer(*, claim: Claim, status_code: int, body: bytes) -> None:
    """Keep the final answer to the claimed key; call it in the call's transaction, before it
    commits.

    Raises IdempotencyKeyInProgress if the claim was taken over meanwhile: the call must then not
    commit, since the run that took it over answers the key.
    """
    _settle(
        claim,
        status_code=status_code,
        response_body=body.decode("utf-8"),
        completed_at=timezone.now(),
    )


def host_key_unfinished(*, claim: Claim, status_code: int, body: bytes) -> None:
    """Leave the claimed key unfinished after an answer that is not final (kept for the record,
    never given again): the same request with it runs again in the claim's session. Called as
    host_key_answer is, and raises as it does."""
    _settle(claim, status_code=status_code, response_body=body.decode("utf-8"), unfinished=True)


def _settle(claim: Claim, **fields: Any) -> None:
    settled = HostIdempotencyKey.objects.filter(
        pk=claim.pk, claimed_at=claim.claimed_at, completed_at=None, unfinished=False
    ).update(**fields)
    if settled != 1:
        raise IdempotencyKeyInProgress()


def host_key_release(*, claim: Claim) -> None:
    """Give the claimed key up, unanswered: the same request with it runs again, in the key's
    session if an earlier run left it unfinished, else as a new key."""
    try:
        # A savepoint: called within the call's transaction too, which a failure here must not
        # leave broken.
        with transaction.atomic():
            held = HostIdempotencyKey.objects.filter(
                pk=claim.pk, claimed_at=claim.claimed_at, completed_at=None, unfinished=False
            )
            if claim.resumed:
                held.update(unfinished=True)
            else:
                held.delete()
    except DatabaseError as exc:
        # Called while an error is on its way out (the database may be why): the key is then
        # taken over after take_over_after() rather than freed now.
        logger.warning("Could not free an %s: %s", HEADER, str(exc).strip()[:200])


def host_keys_prune(*, now: datetime | None = None, batches: int | None = None) -> int:
    """Delete the keys past TOOLGATE_IDEMPOTENCY_KEY_HOURS, oldest first, in batches of
    PRUNE_BATCH (all that are due when `batches` is None); returns how many."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.TOOLGATE_IDEMPOTENCY_KEY_HOURS)
    deleted = 0
    for _ in range(batches) if batches is not None else itertools.count():
        ids = list(
            HostIdempotencyKey.objects.filter(claimed_at__lt=cutoff)
            .order_by("claimed_at")
            .values_list("pk", flat=True)[:PRUNE_BATCH]
        )
        if ids:
            # Checked again: a key taken over since it was read is not expired.
            deleted += HostIdempotencyKey.objects.filter(
                pk__in=ids, claimed_at__lt=cutoff
            ).delete()[0]
        if len(ids) < PRUNE_BATCH:
            break
    return deleted


def _prune_now_and_then(pk: int, now: datetime) -> None:
    if pk % PRUNE_EVERY != 0:
        return
    try:
        host_keys_prune(now=now, batches=1)
    except Exception:
        logger.exception("Could not prune idempotency keys")


def _shown(key: str) -> str:
    return repr(key if len(key) <= 40 else key[:39] + "…")

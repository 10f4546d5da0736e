"""The audit's chains read back, sealed and verified (dispatch/pipeline/audit_chain.py hashes).

Each app whose rows are chained registers a ChainSource: dispatch its audit records, chained per
agent and session (the head is the session's last record), approvals its confirmation events,
chained per confirmation (the head on the confirmation). `audit_seal` (beat, `manage.py
seal_audit`) hashes the heads of the chains that moved since the previous seal into one seal,
linked to that seal, and writes it out to the sinks of TOOLGATE_AUDIT_SEAL_SINKS; `audit_verify`
(`manage.py verify_audit`) walks every chain against its head and the last seals written out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

import urllib3
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from dispatch.audit_keys import audit_keys
from dispatch.models import AuditRecord, AuditSeal
from dispatch.pipeline.audit_chain import (
    AUDIT_FIELDS,
    GENESIS,
    OWN_HEAD,
    REMOVED,
    Finding,
    Head,
    Link,
    audit_chain,
    covered,
    seal_hash,
    verify_chain,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChainSource:
    """One kind of chained row, as the sealer and the verifier read it."""

    # What its rows are called in the verifier's output ("audit records").
    name: str
    count: Callable[[], int]
    # Every chain's head as another row keeps it, by chain; None where a chain's last row is its
    # head (only seals vouch for where such a chain ends).
    heads: Callable[[], dict[str, tuple[int, str]]] | None
    # Every row, as (chain, link), ordered by chain, then seq and id.
    links: Callable[[], Iterator[tuple[str, Link]]]
    # The heads of the chains that may have moved since then (all of them for None).
    heads_since: Callable[[datetime | None], Iterable[Head]]


_sources: dict[str, ChainSource] = {}


def chain_source_register(source: ChainSource) -> None:
    _sources[source.name] = source


def chain_sources() -> list[ChainSource]:
    return list(_sources.values())


# The audit records, chained per agent and session.

_CHUNK = 5000


def _audit_count() -> int:
    return AuditRecord.objects.count()


def _audit_links() -> Iterator[tuple[str, Link]]:
    rows = (
        AuditRecord.objects.order_by("agent_id", "session_id", "chain_seq", "id")
        .values("id", "chain_seq", "chain_hash", "chain_mac", *AUDIT_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    for row in rows:
        yield (
            audit_chain(row["agent_id"], row["session_id"]),
            Link(
                row["id"],
                row["chain_seq"],
                row["chain_hash"],
                covered(AUDIT_FIELDS, row),
                row["chain_mac"],
            ),
        )


def _audit_heads_since(since: datetime | None) -> Iterator[Head]:
    """The last record of each session that recorded since then: its chain's head. One pass over
    the records of the range, by session, each session's highest place first; a session whose
    head came in just before `since` is within the seal's overlap."""
    moved = AuditRecord.objects.filter(chain_seq__isnull=False)
    if since is not None:
        moved = moved.filter(at__gte=since)
    rows = moved.order_by("agent_id", "session_id", "-chain_seq").values_list(
        "agent_id", "session_id", "chain_seq", "chain_hash"
    )
    sessions = groupby(rows.iterator(chunk_size=_CHUNK), key=lambda row: (row[0], row[1]))
    for (agent_id, session_id), records in sessions:
        _, _, seq, head = next(records)
        yield Head(audit_chain(agent_id, session_id), seq or 0, head)


chain_source_register(
    ChainSource(
        name="audit records",
        count=_audit_count,
        heads=None,
        links=_audit_links,
        heads_since=_audit_heads_since,
    )
)


# Seals.


def _overlap() -> timedelta:
    # A call's head may move a while after the moment its session says it was called: a seal
    # takes every chain that moved since a little before the previous seal.
    return timedelta(seconds=settings.TOOLGATE_AUDIT_SEAL_OVERLAP_SECONDS)


def seal_document(seal: AuditSeal) -> dict[str, Any]:
    """A seal as it is written out, one JSON object."""
    return {
        "seal": seal.number,
        "at": _seal_time(seal.at),
        "previous": seal.previous,
        "hash": seal.hash,
        "heads": seal.heads,
    }


def _seal_time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


@transaction.atomic
def audit_seal(*, now: datetime | None = None) -> AuditSeal:
    """Seal the heads of the chains that moved since the previous seal, and write the seal out
    once it is committed."""
    now = now or timezone.now()
    # Not locked: the application's role may only append seals. Two seals at once cannot both be
    # the next: the unique number refuses the second.
    last = AuditSeal.objects.order_by("-number").first()
    since = None if last is None else last.at - _overlap()
    heads = sorted(
        {head for source in chain_sources() for head in source.heads_since(since) if head.seq}
    )
    number = 1 if last is None else last.number + 1
    previous = GENESIS if last is None else last.hash
    seal = AuditSeal.objects.create(
        number=number,
        at=now,
        previous=previous,
        hash=seal_hash(number=number, at=_seal_time(now), previous=previous, heads=heads),
        heads=[list(head) for head in heads],
    )
    transaction.on_commit(lambda: seal_write_out(seal))
    return seal


def seal_write_out(seal: AuditSeal) -> None:
    """Write the seal to every sink; a sink that fails is logged, the others still get it."""
    line = json.dumps(seal_document(seal), separators=(",", ":"), ensure_ascii=False)
    for sink in settings.TOOLGATE_AUDIT_SEAL_SINKS:
        try:
            _write(sink, line)
        except Exception:
            logger.exception("audit seal %s was not written to %s", seal.number, sink)


_seal_log = logging.getLogger("toolgate.audit.seal")


def _write(sink: str, line: str) -> None:
    if sink == "log":
        _seal_log.info("%s", line)
    elif sink.startswith("file:"):
        with open(sink.removeprefix("file:"), "a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
    elif sink.startswith(("https://", "http://")):
        body = line.encode()
        stamp = int(time.time())
        secret = settings.TOOLGATE_AUDIT_SEAL_WEBHOOK_SECRET.encode()
        digest = hmac.new(secret, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        response = urllib3.request(
            "POST",
            sink,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Toolgate-Signature": f"t={stamp},v1={digest}",
            },
            timeout=settings.TOOLGATE_WEBHOOK_TIMEOUT_SECONDS,
            retries=False,
        )
        if response.status >= 300:
            raise RuntimeError(f"the receiver answered {response.status}")
    else:  # pragma: no cover - the setting is checked at start (toolgate/settings/base.py)
        raise ValueError(f"unknown audit seal sink {sink!r}")


# Verification.


@dataclass
class SealFile:
    """What a file of seals says: each chain's last sealed head, and what is wrong with it."""

    count: int = 0
    last: Mapping[str, Any] | None = None
    sealed: dict[str, tuple[int, str]] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


def seals_read(lines: Iterable[str]) -> SealFile:
    """Check the seals' own chain (each hash, each link to the one before) and keep the last
    head each names of every chain."""
    seals = SealFile()
    previous: Mapping[str, Any] | None = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            seal = json.loads(text)
            heads = [Head(str(chain), int(seq), str(head)) for chain, seq, head in seal["heads"]]
            computed = seal_hash(
                number=seal["seal"], at=seal["at"], previous=seal["previous"], heads=heads
            )
        except (ValueError, KeyError, TypeError):
            seals.findings.append(f"line {number} is not a seal")
            continue
        if computed != seal["hash"]:
            seals.findings.append(f"seal {seal['seal']} (line {number}) does not match its hash")
            continue
        if (
            previous is not None
            and seal["seal"] == previous["seal"] + 1
            and seal["previous"] != previous["hash"]
        ):
            seals.findings.append(
                f"seal {seal['seal']} (line {number}) does not follow seal {previous['seal']}"
            )
        seals.count += 1
        previous = seals.last = seal
        for head in heads:
            seals.sealed[head.chain] = (head.seq, head.hash)
    return seals


Progress = Callable[[str], None]


@dataclass
class Verification:
    chains: int = 0
    records: int = 0
    findings: list[Finding] = field(default_factory=list)
    # What is wrong with the seals themselves.
    seal_findings: list[str] = field(default_factory=list)


def audit_verify(
    *, seals: SealFile | None = None, progress: Progress | None = None, every: int = 100_000
) -> Verification:
    """Walk every chain of every source, in one snapshot of the database."""
    result = Verification()
    sealed = dict(seals.sealed) if seals is not None else {}
    if seals is not None:
        result.seal_findings.extend(seals.findings)
    # Every key, the rotated-out ones too: each verifies the links it signed.
    keys = audit_keys().by_id
    snapshot = connection.vendor == "postgresql" and not connection.in_atomic_block
    with transaction.atomic():
        if snapshot:
            with connection.cursor() as cursor:
                # One snapshot: calls recording meanwhile move heads the walk must not see.
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if seals is not None:
            result.seal_findings.extend(_stored_seals_differ(seals))
        for source in chain_sources():
            total = source.count()
            if progress:
                progress(f"{source.name}: {total:,}")
            heads = source.heads() if source.heads is not None else None
            walked = 0
            for chain, rows in groupby(source.links(), key=lambda pair: pair[0]):
                result.chains += 1
                links = (link for _, link in rows)
                head = OWN_HEAD if heads is None else heads.pop(chain, None)
                for item in verify_chain(chain, links, head, sealed.pop(chain, None), keys):
                    if isinstance(item, Finding):
                        result.findings.append(item)
                        continue
                    walked += 1
                    if progress and walked % every == 0:
                        progress(f"{source.name}: {walked:,} of {total:,}")
                # A chain stopped at its finding: the rest of its rows still count as walked.
                for _ in links:
                    walked += 1
            result.records += walked
            # Chains whose every record is gone: their head, or their seal, still names them.
            for chain, (seq, _) in (heads or {}).items():
                if seq:
                    result.chains += 1
                    result.findings.append(
                        Finding(
                            chain,
                            1,
                            None,
                            REMOVED,
                            f"every record is gone; its head is at seq {seq}",
                        )
                    )
                    sealed.pop(chain, None)
            if progress:
                progress(f"{source.name}: {walked:,} walked")
        for chain, (seq, _) in sealed.items():
            result.findings.append(
                Finding(chain, 1, None, REMOVED, f"sealed at seq {seq}, nothing of it is left")
            )
    return result


def _stored_seals_differ(seals: SealFile) -> list[str]:
    """The seals the database keeps that differ from the ones written out."""
    if seals.last is None:
        return []
    stored = AuditSeal.objects.filter(number=seals.last["seal"]).first()
    if stored is None:
        return [f"the database has no seal {seals.last['seal']}, the last one written out"]
    if stored.hash != seals.last["hash"]:
        return [f"the database's seal {stored.number} is not the one written out"]
    return []

"""The hash chains of the audit trail, and what a verifier makes of them.

Every audit record is a link of its session's chain (agent and session), every event of a
confirmation a link of that confirmation's chain. A link's hash is SHA-256 over a canonical text:
its chain, its sequence number in the chain (1, 2, ...), the previous link's hash (GENESIS before
the first) and the row's fields that matter, as sorted-key JSON. Chains that concurrent agents
never share keep one call from waiting on another's; a seal, periodically, hashes the heads of the
chains that moved into one line written where the database's owner cannot rewrite it.

Each link also carries a MAC: HMAC-SHA256 of its hash under a key that only the processes
writing the links hold (never the database), named by its id (`<key id>:<hex>`). Whoever can
only write to the database can append a link with a correct hash, never with its MAC; the
verifier, given the keys, names such a link FORGED. The first key signs, the others verify the
links written before a rotation.

Plain values in, plain values out: the writers (dispatch.store, approvals.services) and the
verifier (`manage.py verify_audit`) use this module and nothing else to compute a hash.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from dispatch.pipeline.canonical import canonical_json_finite

# The previous hash of a chain's first link, and of the first seal.
GENESIS = "0" * 64

# The audit record's fields a link covers: every column but its id and its link.
AUDIT_FIELDS = (
    "call_id",
    "at",
    "agent_id",
    "session_id",
    "customer_id",
    "step",
    "tool",
    "raw_arguments",
    "arguments",
    "key",
    "ok",
    "code",
    "message",
    "replayed",
    "confirmation_id",
    "policy_version",
    "duration_ms",
    "channel",
)

# A confirmation event's.
EVENT_FIELDS = (
    "confirmation_id",
    "at",
    "kind",
    "actor_id",
    "actor_label",
    "message",
    "data",
)


# A policy event's (approvals.models.PolicyEvent): who drafted, approved or withdrew a change.
POLICY_EVENT_FIELDS = (
    "chain",
    "at",
    "kind",
    "change_id",
    "agent_id",
    "actor_id",
    "actor_label",
    "data",
)


def policy_chain(agent_id: int | str) -> str:
    """The chain of an agent's policy changes and emergency stops."""
    return f"policy:{agent_id}"


def limits_chain(reviewer_id: int | str) -> str:
    """The chain of a reviewer's approval limits' changes."""
    return f"limits:{reviewer_id}"


def audit_chain(agent_id: int | str, session_id: str) -> str:
    return f"audit:{agent_id}:{session_id}"


def event_chain(confirmation_id: str) -> str:
    return f"events:{confirmation_id}"


def _plain(value: Any) -> Any:
    """A value as it reads back from any database: datetimes in UTC to the microsecond, integral
    floats as integers (PostgreSQL's jsonb gives 1e20 back as 100000000000000000000)."""
    kind = type(value)
    # The exact types first: this runs on every field of every call.
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is dict:
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def canonical(chain: str, seq: int, previous: str, fields: Mapping[str, Any]) -> bytes:
    document = {"chain": chain, "fields": _plain(fields), "previous": previous, "seq": seq}
    return canonical_json_finite(document).encode()


def link_hash(*, chain: str, seq: int, previous: str, fields: Mapping[str, Any]) -> str:
    """The hash of the link at `seq` of `chain`, after the link whose hash is `previous`."""
    return hashlib.sha256(canonical(chain, seq, previous or GENESIS, fields)).hexdigest()


def link_mac(*, key_id: str, key: bytes, chain_hash: str) -> str:
    """The MAC of a link whose hash is `chain_hash`, under the key `key_id` names."""
    return f"{key_id}:{hmac.new(key, chain_hash.encode(), hashlib.sha256).hexdigest()}"


def mac_problem(keys: Mapping[str, bytes], chain_hash: str, mac: str | None) -> str | None:
    """What is wrong with a link's MAC, or None if one of the keys made it for its hash."""
    key_id, _, digest = (mac or "").partition(":")
    if not digest:
        return "its hash holds but it has no MAC: it was not written with the audit key"
    key = keys.get(key_id)
    if key is None:
        return f"its MAC names key {key_id!r}, which is not among the audit keys"
    if not hmac.compare_digest(link_mac(key_id=key_id, key=key, chain_hash=chain_hash), mac or ""):
        return f"its hash holds but its MAC under key {key_id!r} does not"
    return None


def covered(names: Sequence[str], row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in names}


class Head(NamedTuple):
    """A chain's last link: its sequence number and hash (0 and "" before its first)."""

    chain: str
    seq: int
    hash: str


def seal_hash(*, number: int, at: str, previous: str, heads: Iterable[Head]) -> str:
    """The hash of seal `number`: the heads it names, sorted, after the previous seal's hash."""
    document = {
        "at": at,
        "heads": sorted([head.chain, head.seq, head.hash] for head in heads),
        "number": number,
        "previous": previous or GENESIS,
    }
    return hashlib.sha256(
        json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


# The head of a chain whose last link is its head: nothing else keeps it (the audit records; only
# seals vouch for where such a chain ends).
OWN_HEAD = (-1, "")

# What a finding says of its record.
ALTERED = "altered"
REMOVED = "removed"
INSERTED = "inserted"
# A link with a correct hash that the audit key did not sign: appended or rewritten by someone
# who could write to the database but did not hold the key.
FORGED = "forged"


@dataclass(frozen=True, slots=True)
class Finding:
    chain: str
    seq: int | None
    # The row the finding names (the one after a gap, for a removal), if there is one.
    record_id: int | str | None
    what: str
    detail: str

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "no seq"
        row = f"record {self.record_id}" if self.record_id is not None else "no record"
        return f"{self.what.upper()} {self.chain} {where} ({row}): {self.detail}"


class Link(NamedTuple):
    """A stored row of a chain: its id, its sequence number and hash (None if it has none), and
    the fields its hash covers."""

    id: int | str
    seq: int | None
    hash: str | None
    fields: Mapping[str, Any]
    # `<key id>:<hex>`, or "" where the row has none.
    mac: str | None = None


def verify_chain(
    chain: str,
    links: Iterable[Link],
    head: tuple[int, str] | None,
    sealed: tuple[int, str] | None = None,
    keys: Mapping[str, bytes] | None = None,
) -> Iterator[Finding | Link]:
    """Walk one chain's links in order of (seq, id); yield each link as it is checked and the
    chain's first finding, if any, after which the walk stops.

    `head` is the chain's head as its row keeps it (None: the row is gone; OWN_HEAD: the chain's
    last link is its head, kept nowhere else), `sealed` the last head a seal wrote out for it,
    `keys` the audit keys by id (None: the MACs are not checked)."""
    expected, previous = 1, GENESIS
    at_sealed: str | None = None
    last_id: int | str | None = None
    for link in links:
        yield link
        if link.seq is None:
            yield Finding(chain, None, link.id, INSERTED, "a record outside the chain (no seq)")
            return
        if link.seq < expected:
            yield Finding(
                chain,
                link.seq,
                link.id,
                INSERTED,
                f"a second record at seq {link.seq} (after record {last_id})",
            )
            return
        if link.seq > expected:
            missing = (
                f"seq {expected}"
                if link.seq == expected + 1
                else f"seq {expected} to {link.seq - 1}"
            )
            yield Finding(chain, expected, link.id, REMOVED, f"{missing} missing before this one")
            return
        computed = link_hash(chain=chain, seq=link.seq, previous=previous, fields=link.fields)
        if computed != link.hash:
            yield Finding(
                chain,
                link.seq,
                link.id,
                ALTERED,
                "its fields or hash do not match its chain",
            )
            return
        if keys is not None:
            problem = mac_problem(keys, computed, link.mac)
            if problem is not None:
                yield Finding(chain, link.seq, link.id, FORGED, problem)
                return
        if sealed is not None and link.seq == sealed[0]:
            at_sealed = computed
        previous, expected, last_id = computed, expected + 1, link.id
    tail = expected - 1
    if head is OWN_HEAD:
        pass
    elif head is None:
        if tail:
            yield Finding(chain, tail, last_id, REMOVED, "the row keeping the chain's head is gone")
            return
    else:
        head_seq, head_hash = head
        if head_seq > tail:
            yield Finding(
                chain,
                tail + 1,
                None,
                REMOVED,
                f"the chain ends at seq {tail}, its head is at seq {head_seq}",
            )
            return
        if head_seq < tail:
            yield Finding(
                chain,
                head_seq + 1,
                None,
                INSERTED,
                f"records after its head (seq {head_seq}) up to seq {tail}",
            )
            return
        if tail and head_hash != previous:
            yield Finding(chain, tail, last_id, ALTERED, "the chain's head does not match it")
            return
    if sealed is not None:
        sealed_seq, sealed_hash = sealed
        if sealed_seq > tail:
            yield Finding(
                chain,
                tail + 1,
                None,
                REMOVED,
                f"sealed at seq {sealed_seq}, the chain now ends at seq {tail}",
            )
        elif sealed_seq and at_sealed != sealed_hash:
            yield Finding(
                chain,
                sealed_seq,
                None,
                ALTERED,
                f"the chain was rewritten: seq {sealed_seq} is not the one sealed",
            )

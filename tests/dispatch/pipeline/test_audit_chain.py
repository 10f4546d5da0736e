"""The audit chain's hash and its verifier, on plain values."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch.pipeline.audit_chain import (
    ALTERED,
    GENESIS,
    INSERTED,
    OWN_HEAD,
    REMOVED,
    Finding,
    Link,
    audit_chain,
    link_hash,
    verify_chain,
)
from dispatch.pipeline.canonical import canonical_json_finite
from tests.dispatch.pipeline.conftest import Harness

CHAIN = audit_chain(1, "s-1")


def chained(*fields: dict[str, Any]) -> list[Link]:
    links, previous = [], GENESIS
    for seq, row in enumerate(fields, start=1):
        previous = link_hash(chain=CHAIN, seq=seq, previous=previous, fields=row)
        links.append(Link(seq * 10, seq, previous, row))
    return links


Tip = tuple[int, str | None]


def findings(links: list[Link], head: Tip | None, sealed: Tip | None = None) -> list[Finding]:
    def pair(tip: Tip | None) -> tuple[int, str] | None:
        return None if tip is None else (tip[0], tip[1] or "")

    return [
        item
        for item in verify_chain(CHAIN, links, pair(head), pair(sealed))
        if isinstance(item, Finding)
    ]


ROWS = [{"code": "OK", "n": n} for n in range(5)]


def test_a_whole_chain_matching_its_head_and_seal_has_no_finding() -> None:
    links = chained(*ROWS)

    assert findings(links, (5, links[-1].hash), (3, links[2].hash)) == []


def test_it_names_the_record_whose_field_changed() -> None:
    links = chained(*ROWS)
    links[2] = links[2]._replace(fields={"code": "REFUSED", "n": 2})

    assert findings(links, (5, links[-1].hash)) == [
        Finding(CHAIN, 3, 30, ALTERED, "its fields or hash do not match its chain")
    ]


def test_it_names_the_gap_a_removed_record_leaves() -> None:
    links = chained(*ROWS)
    del links[1]

    [finding] = findings(links, (5, links[-1].hash))
    assert (finding.what, finding.seq, finding.record_id) == (REMOVED, 2, 30)


def test_it_names_a_record_inserted_at_a_taken_place() -> None:
    links = chained(*ROWS)
    links.insert(2, Link(99, 2, links[1].hash, links[1].fields))

    [finding] = findings(links, (5, links[-1].hash))
    assert (finding.what, finding.seq, finding.record_id) == (INSERTED, 2, 99)


def test_a_tail_removed_shows_against_the_head_and_against_the_seal() -> None:
    links = chained(*ROWS)
    head, sealed = (5, links[-1].hash), (5, links[-1].hash)

    [by_head] = findings(links[:3], head)
    # Its owner moved the head back too: the seal written out still has it.
    [by_seal] = findings(links[:3], (3, links[2].hash), sealed)

    assert (by_head.what, by_head.seq) == (REMOVED, 4)
    assert (by_seal.what, by_seal.seq) == (REMOVED, 4)


def test_a_chain_rewritten_whole_shows_only_against_its_seal() -> None:
    original = chained(*ROWS)
    rewritten = chained(*ROWS[:2], {"code": "REFUSED", "n": 2}, *ROWS[3:])

    assert findings(rewritten, (5, rewritten[-1].hash)) == []
    [finding] = findings(rewritten, (5, rewritten[-1].hash), (4, original[3].hash))
    assert (finding.what, finding.seq) == (ALTERED, 4)


def test_the_hash_reads_the_same_from_any_database() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=UTC)
    written = {"at": moment, "arguments": {"b": 1e20, "a": [1.0, 0.5]}}
    # PostgreSQL gives the time back in the session's zone and jsonb's numbers as it keeps them.
    read = {
        "arguments": {"a": [1, 0.5], "b": 100000000000000000000},
        "at": moment.astimezone(timezone(timedelta(hours=-3))),
    }

    assert link_hash(chain=CHAIN, seq=1, previous="", fields=written) == link_hash(
        chain=CHAIN, seq=1, previous=GENESIS, fields=read
    )


def test_the_memory_store_chains_its_records_per_session(harness: Harness) -> None:
    harness.call("get_order", {"order_id": "ORD-1001"})
    harness.refund(1000)
    harness.call("get_order", {"order_id": "ORD-1001"}, session="s-2")
    harness.refund(1000)
    state = harness.state

    chains = {link.chain for link in state.links}

    assert chains == {audit_chain("agent-1", "s-1"), audit_chain("agent-1", "s-2")}
    for chain in chains:
        seqs = [link.seq for link in state.links if link.chain == chain]
        assert seqs == list(range(1, len(seqs) + 1))
    assert len(set(link.hash for link in state.links)) == len(state.links)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _json_values, max_size=6))
def test_the_canonical_text_is_json_dumps_sorted_compact_and_unescaped(
    value: dict[str, Any],
) -> None:
    # The chain hashes this text: it must stay the one json.dumps gives with these options.
    assert canonical_json_finite(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_the_canonical_text_refuses_numbers_json_cannot_hold(number: float) -> None:
    with pytest.raises(ValueError):
        canonical_json_finite({"amount": number})


def own_head_findings(links: list[Link], sealed: tuple[int, str] | None = None) -> list[Finding]:
    return [
        item for item in verify_chain(CHAIN, links, OWN_HEAD, sealed) if isinstance(item, Finding)
    ]


def test_a_chain_that_is_its_own_head_holds_at_any_length() -> None:
    links = chained(*ROWS)

    assert own_head_findings(links) == []
    assert own_head_findings(links[:3]) == []


def test_a_chain_that_is_its_own_head_cut_short_after_a_seal_is_found_by_the_seal() -> None:
    links = chained(*ROWS)

    [finding] = own_head_findings(links[:3], sealed=(5, links[-1].hash or ""))

    assert (finding.what, finding.seq) == (REMOVED, 4)

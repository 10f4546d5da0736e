"""The audit chains' keys: a link appended with a correct hash by someone who can write to the
database but does not hold the key is named FORGED by `verify_audit`, before or after a seal; the
key rotates, and the old key still verifies what it signed."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from pytest_django import Settings

from dispatch.audit import audit_seal
from dispatch.models import Agent, AuditRecord
from dispatch.pipeline.audit_chain import AUDIT_FIELDS, audit_chain, covered, link_hash, link_mac
from tests.dispatch.test_audit import Capture, audited, chain, read, verify
from toolgate.settings.base import DEVELOPMENT_AUDIT_KEY, audit_keys

__all__ = ["audited"]

NEW_KEY = "k2:" + "n" * 40
OLD_KEY = "k1:" + "o" * 40


def append_at_the_end(agent: Agent, session: str = "s-1", mac: str = "") -> AuditRecord:
    """A record appended at the end of a session's chain, its hash computed as the product does,
    as the application's role may insert it: everything right but the key."""
    last = chain(agent, session)[-1]
    row: dict[str, Any] = dict(AuditRecord.objects.filter(pk=last.pk).values().get())
    row.pop("id")
    fields = {
        **covered(AUDIT_FIELDS, row),
        "call_id": f"forged-{session}",
        "at": row["at"] + timedelta(seconds=1),
        "message": "Refunded 1,000.00 BRL.",
    }
    seq = (last.chain_seq or 0) + 1
    name = audit_chain(agent.pk, session)
    linked = link_hash(chain=name, seq=seq, previous=last.chain_hash, fields=fields)
    return AuditRecord.objects.create(
        **{**row, **fields, "chain_seq": seq, "chain_hash": linked, "chain_mac": mac}
    )


def test_every_link_carries_the_mac_of_its_hash_under_the_signing_key(audited: Agent) -> None:
    key_id, _, secret = DEVELOPMENT_AUDIT_KEY.partition(":")

    records = chain(audited)

    assert [r.chain_mac for r in records] == [
        link_mac(key_id=key_id, key=secret.encode(), chain_hash=r.chain_hash) for r in records
    ]


def test_a_record_appended_with_a_correct_hash_but_without_the_key_is_named_forged(
    audited: Agent,
) -> None:
    forged = append_at_the_end(audited)

    code, out = verify()

    assert code == 1
    assert (
        f"FORGED audit:{audited.pk}:s-1 seq 6 (record {forged.pk}): its hash holds but it has no "
        "MAC" in out
    )


def test_a_record_appended_with_a_mac_under_another_key_is_named_forged(
    audited: Agent,
) -> None:
    guessed = link_mac(key_id="dev", key=b"x" * 40, chain_hash="0" * 64)

    forged = append_at_the_end(audited, "s-2", mac=guessed)
    code, out = verify()

    assert code == 1
    assert (
        f"FORGED audit:{audited.pk}:s-2 seq 3 (record {forged.pk}): its hash holds but its MAC "
        "under key 'dev' does not" in out
    )


def test_a_forged_record_is_named_whether_it_came_before_or_after_the_last_seal(
    audited: Agent,
    settings: Settings,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = [f"file:{seals}"]
    before = append_at_the_end(audited, "s-1")
    with django_capture_on_commit_callbacks(execute=True):
        audit_seal()
    after = append_at_the_end(audited, "s-2")

    code, out = verify("--seals", str(seals))

    assert code == 1
    assert f"FORGED audit:{audited.pk}:s-1 seq 6 (record {before.pk})" in out
    assert f"FORGED audit:{audited.pk}:s-2 seq 3 (record {after.pk})" in out


def test_a_rotated_key_signs_what_comes_next_and_the_old_one_verifies_what_it_signed(
    make_agent: Any, orders: Any, settings: Settings
) -> None:
    settings.TOOLGATE_AUDIT_KEYS = [OLD_KEY]
    agent, _ = make_agent()
    read(agent)
    settings.TOOLGATE_AUDIT_KEYS = [NEW_KEY, OLD_KEY]

    read(agent)
    rotated = verify()
    settings.TOOLGATE_AUDIT_KEYS = [NEW_KEY]
    rotated_out = verify()

    assert [r.chain_mac.partition(":")[0] for r in chain(agent)] == ["k1", "k2"]
    assert rotated[0] == 0, rotated[1]
    assert rotated_out[0] == 1
    assert (
        f"FORGED audit:{agent.pk}:s-1 seq 1 (record {chain(agent)[0].pk}): its MAC names key "
        "'k1', which is not among the audit keys" in rotated_out[1]
    )


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        (["k1:short"], "at least 32"),
        ([":" + "s" * 40], "letters, digits"),
        (["key one:" + "s" * 40], "letters, digits"),
        ([OLD_KEY, OLD_KEY], "given twice"),
    ],
)
def test_the_settings_refuse_a_key_that_is_too_short_misnamed_or_given_twice(
    entries: list[str], problem: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=problem):
        audit_keys(entries)

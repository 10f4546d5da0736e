"""A record the application's role appends at the end of a chain, with the very hash the product
would compute, is named by `verify_audit`: the role cannot make its MAC without the audit key,
which only the processes hold (docs/audit.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dispatch.pipeline.audit_chain import AUDIT_FIELDS, audit_chain, link_hash
from tests.deploy.conftest import App
from tests.deploy.site import ROOT


def _append_as_app(site_app: App, session: str) -> int:
    """The app role reads the session's last record and appends the next one, with a correct
    hash and a MAC guessed without the key; returns its id."""
    database = site_app.site.database
    columns = ", ".join(AUDIT_FIELDS)
    with database.connect(database.app) as connection:
        row = connection.execute(
            f"SELECT {columns}, chain_seq, chain_hash FROM dispatch_auditrecord "
            "WHERE session_id = %s ORDER BY chain_seq DESC LIMIT 1",
            [session],
        ).fetchone()
        assert row is not None
        fields = dict(zip(AUDIT_FIELDS, row[: len(AUDIT_FIELDS)], strict=True))
        seq, previous = row[-2] + 1, row[-1]
        fields.update(call_id=f"forged-{session}", message="Refunded 900.00 BRL.", step=seq)
        linked = link_hash(
            chain=audit_chain(fields["agent_id"], session),
            seq=seq,
            previous=previous,
            fields=fields,
        )
        values = [
            json.dumps(value) if name == "arguments" and value is not None else value
            for name, value in fields.items()
        ]
        inserted = connection.execute(
            f"INSERT INTO dispatch_auditrecord ({columns}, chain_seq, chain_hash, chain_mac) "
            f"VALUES ({', '.join(['%s'] * len(AUDIT_FIELDS))}, %s, %s, %s) RETURNING id",
            [*values, seq, linked, "1:" + "0" * 64],
        ).fetchone()
    assert inserted is not None
    return int(inserted[0])


def _verify(site_app: App, *arguments: str) -> tuple[int, str]:
    production = site_app.site.production
    completed = subprocess.run(
        [sys.executable, "manage.py", "verify_audit", *arguments],
        cwd=ROOT,
        env=production.env_of("verify_audit"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return completed.returncode, completed.stdout + completed.stderr


def test_a_record_the_application_role_appends_with_a_correct_hash_is_named_by_verify_audit(
    site_app: App, tmp_path: Path
) -> None:
    database, production = site_app.site.database, site_app.site.production
    order_id = database.order_create(total_cents=12_000, customer_id="CUS-930")
    client = site_app.client()
    # Two amounts: the same refund again from another session would be held as a duplicate.
    for session, amount in (("keyed-1", 1000), ("keyed-2", 700)):
        result = client.refund(amount, order_id=order_id, session=session, customer="CUS-930")
        assert result["ok"], result
    clean, clean_out = _verify(site_app)
    seals = tmp_path / "seals.jsonl"

    before = _append_as_app(site_app, "keyed-1")
    production.manage("seal_audit", TOOLGATE_AUDIT_SEAL_SINKS=f"file:{seals}")
    after = _append_as_app(site_app, "keyed-2")
    code, out = _verify(site_app, "--seals", str(seals))

    assert clean == 0, clean_out
    assert code == 1, out
    assert f"seq 2 (record {before}): its hash holds but its MAC under key '1' does not" in out
    assert f"seq 2 (record {after}): its hash holds but its MAC under key '1' does not" in out
    assert out.count("FORGED audit:") == 2

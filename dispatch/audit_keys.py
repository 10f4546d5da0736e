"""The audit chains' keys, from the settings (TOOLGATE_AUDIT_KEYS, docs/audit.md): the first
signs every link written, all of them verify."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet

from dispatch.pipeline.audit_chain import link_mac


class AuditKeys(NamedTuple):
    signing_id: str
    signing: bytes
    by_id: dict[str, bytes]


@lru_cache(maxsize=4)
def _parsed(entries: tuple[str, ...]) -> AuditKeys:
    if not entries:
        raise ImproperlyConfigured("no audit key: set TOOLGATE_AUDIT_KEYS (docs/audit.md)")
    by_id = {}
    for entry in entries:
        key_id, _, secret = entry.partition(":")
        by_id[key_id] = secret.encode()
    signing_id = entries[0].partition(":")[0]
    return AuditKeys(signing_id, by_id[signing_id], by_id)


def audit_keys() -> AuditKeys:
    # Read each time (cached on the value): a test, or a reload, may change the setting.
    return _parsed(tuple(settings.TOOLGATE_AUDIT_KEYS))


def audit_mac(chain_hash: str) -> str:
    """The MAC of a link this process writes, under the signing key."""
    keys = audit_keys()
    return link_mac(key_id=keys.signing_id, key=keys.signing, chain_hash=chain_hash)


# Rows signed a batch at a time by the migrations that add the MAC.
_SIGN_BATCH = 2000


def audit_sign_existing(schema_editor: Any, rows: QuerySet[Any], table: str) -> None:
    """Give the chained rows that have a hash and no MAC theirs, under the signing key: the
    migrations that add the column run it, as the tables' owner (on PostgreSQL the append-only
    trigger is set aside for it)."""
    rows = rows.filter(chain_mac="").exclude(chain_hash="")
    if not rows.exists():
        return
    postgresql = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        last = 0
        while True:
            batch = list(
                rows.filter(id__gt=last)
                .order_by("id")
                .values_list("id", "chain_hash")[:_SIGN_BATCH]
            )
            if not batch:
                break
            cursor.executemany(
                f"UPDATE {table} SET chain_mac = %s WHERE id = %s",
                [(audit_mac(chain_hash), pk) for pk, chain_hash in batch],
            )
            last = batch[-1][0]
        if postgresql:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")

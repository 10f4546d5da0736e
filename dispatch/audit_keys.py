"""The audit chains' keys, from the settings (TOOLGATE_AUDIT_KEYS, docs/audit.md): the first
signs every link written, all of them verify."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

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

"""Seal the heads of the audit chains that moved, now, and write the seal out (beat does it
every TOOLGATE_AUDIT_SEAL_SECONDS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from dispatch.audit import audit_seal


class Command(BaseCommand):
    help = "Seal the heads of the audit chains and write the seal to TOOLGATE_AUDIT_SEAL_SINKS."

    def handle(self, *args: Any, **options: Any) -> None:
        seal = audit_seal()
        self.stdout.write(f"seal {seal.number}: {len(seal.heads)} chains, {seal.hash}")

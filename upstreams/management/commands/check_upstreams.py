"""Compare each declared upstream's current OpenAPI document with the reviewed one."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from upstreams.drift import document_drift
from upstreams.http import UpstreamFault
from upstreams.mcp import McpUpstream
from upstreams.registry import loaded

logger = logging.getLogger("upstreams.drift")


class Command(BaseCommand):
    help = (
        "Fetch each declared upstream's current OpenAPI document and compare it with the one its "
        "declarations were reviewed with; fail on any operation removed, moved or described "
        "differently."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        failed = []
        for name, (upstream, specs) in sorted(loaded.items()):
            try:
                if isinstance(upstream, McpUpstream):
                    listed = upstream.listed()
                    drift = [
                        f"{tool}: no longer offered"
                        for tool in upstream.declared.tools
                        if tool not in listed
                    ]
                else:
                    current = upstream.current_document()
                    drift = document_drift(upstream.declared.document(), current)
            except UpstreamFault as fault:
                failed.append(name)
                self.stderr.write(f"{name}: could not be read ({fault.words})")
                continue
            for line in drift:
                # Recorded for administrators: the log keeps it beside the command's output.
                logger.warning("upstream %s drifted: %s", name, line)
                self.stderr.write(f"{name}: {line}")
            if drift:
                failed.append(name)
            else:
                tools = ", ".join(spec.name for spec in specs)
                self.stdout.write(f"{name}: as reviewed ({tools})")
        if failed:
            raise CommandError(f"upstreams that drifted or could not be read: {', '.join(failed)}")

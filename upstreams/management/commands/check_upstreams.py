"""Compare each declared upstream's current description with the reviewed one: an HTTP
upstream's OpenAPI document, an MCP upstream's tools and their input schemas."""

from __future__ import annotations

import json
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
        "Fetch each declared upstream's current OpenAPI document, or list an MCP upstream's "
        "tools, and compare them with what its declarations were reviewed with; fail on any "
        "operation or tool removed, moved or described differently. --schemas NAME prints an MCP "
        "upstream's current input schemas, to review and keep beside its declaration."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--schemas", metavar="NAME", help="print an MCP upstream's schemas")

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("schemas"):
            self._print_schemas(options["schemas"])
            return
        failed = []
        for name, (upstream, specs) in sorted(loaded.items()):
            try:
                if isinstance(upstream, McpUpstream):
                    drift = upstream.drift()
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

    def _print_schemas(self, name: str) -> None:
        upstream = loaded.get(name, (None, ()))[0]
        if not isinstance(upstream, McpUpstream):
            raise CommandError(f"no MCP upstream {name!r} is loaded")
        try:
            schemas = upstream.current_schemas()
        except UpstreamFault as fault:
            raise CommandError(f"{name}: could not be read ({fault.words})") from None
        self.stdout.write(json.dumps(schemas, indent=2, sort_keys=True))

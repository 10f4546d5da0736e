"""Export rejected payloads from the audit records as regression cases (JSON Lines)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_date, parse_datetime

from dispatch.regressions import RegressionCase, regression_cases, regression_codes


def moment(text: str) -> datetime:
    """An ISO date (midnight UTC) or date and time (UTC unless it says otherwise)."""
    try:
        when = parse_datetime(text)
        day = None if when is not None else parse_date(text)
    except ValueError:
        when = day = None
    if when is None and day is not None:
        when = datetime.combine(day, time(), tzinfo=UTC)
    if when is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO date or time, such as 2026-03-01 or 2026-03-01T09:30:00Z"
        )
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Write the rejected payloads of stages 1 to 3 (unknown tool, tool not allowed, invalid "
        "JSON, invalid arguments) as JSON Lines, one case per tool and raw arguments: tool, "
        "arguments, code and the message given. tests/regressions/ replays every case of its "
        "corpus.jsonl and expects the same code."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", type=moment, help="only calls from this time on")
        parser.add_argument("--until", type=moment, help="only calls before this time")
        parser.add_argument(
            "--code",
            action="append",
            dest="codes",
            metavar="CODE",
            help="only this code (repeat for more); default: every code of stages 1 to 3",
        )
        parser.add_argument(
            "--output", type=Path, help="write to this file instead of the standard output"
        )
        parser.add_argument(
            "--merge",
            action="store_true",
            help="keep the cases already in --output and add the new ones",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        codes: list[str] | None = options["codes"]
        exportable = regression_codes()
        if codes is not None and not set(codes) <= exportable:
            unknown = ", ".join(sorted(set(codes) - exportable))
            raise CommandError(
                f"--code {unknown}: only codes that depend on the call alone are exported: "
                f"{', '.join(sorted(exportable))}."
            )
        output: Path | None = options["output"]
        if options["merge"] and output is None:
            raise CommandError("--merge needs --output, the corpus to add to.")
        kept = self._corpus(output) if options["merge"] and output is not None else []

        export = regression_cases(
            start=options["since"],
            end=options["until"],
            codes=codes,
            known={case.key for case in kept},
        )
        cases = sorted(
            [*kept, *export.cases], key=lambda case: (case.tool, case.code, case.arguments)
        )
        text = "".join(f"{case.as_line()}\n" for case in cases)
        if output is None:
            self.stdout.write(text, ending="")
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")

        summary = f"{len(export.cases)} new case(s)"
        if kept:
            summary += f", {len(kept)} kept"
        if export.cut_short:
            summary += f"; {export.cut_short} left out (raw arguments cut short by the audit)"
        if export.judged_differently:
            summary += (
                f"; {export.judged_differently} left out (the pipeline now gives them another code)"
            )
        # On the standard error, so that the cases alone go to the standard output.
        self.stderr.write(summary + (f" in {output}." if output is not None else "."))

    def _corpus(self, path: Path) -> list[RegressionCase]:
        if not path.exists():
            return []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            return [RegressionCase.from_line(line) for line in lines if line.strip()]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"--merge: cannot read the corpus {path}: {exc}") from None

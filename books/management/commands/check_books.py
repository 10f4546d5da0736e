"""Check the books now, as beat's reconciler does; exit 1 on a breach."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from books.reconciler import BooksNeedPostgreSQL, books_check


class Command(BaseCommand):
    help = (
        "Check the invariants of the books (docs/books.md): over what changed since the last "
        "runs, or with --full over every row (a full sweep finds what a direct UPDATE changed). "
        "Prints each check as it ends and every breach; exits 1 if any was found."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--full", action="store_true", help="read every row, not only what changed"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        full: bool = options["full"]

        def progress(invariant: str, found: int, seconds: float) -> None:
            state = "ok" if not found else f"{found} breach(es)"
            self.stdout.write(f"  {invariant}: {state} ({seconds:.2f} s)")

        self.stdout.write("Full sweep of the books" if full else "Books, over what changed")
        try:
            checked = books_check(full=full, progress=progress)
        except BooksNeedPostgreSQL as error:
            raise CommandError(str(error)) from error
        for item in checked.found:
            self.stdout.write(f"BREACH {item.invariant}: {item.subject}: {item.detail}")
            self.stdout.write(f"  look at {item.look_at}")
        self.stdout.write(
            f"{len(checked.found)} breach(es), {checked.new} new, in {checked.seconds:.2f} s."
        )
        if checked.found:
            raise SystemExit(1)

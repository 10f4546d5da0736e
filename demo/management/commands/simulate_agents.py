"""Drive simulated agent sessions, good and bad, through the real HTTP API, and sum them up."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from analytics.counting import RECOVERY_WINDOW
from analytics.recovery import Recovery, recovery_rate
from demo.fixtures import DEMO_BASE_URL, demo_token
from demo.simulation import (
    DEFAULT_MIX,
    SCENARIOS,
    ApiClient,
    OrderFact,
    SimulationError,
    SimulationReport,
    orders_from_json,
    parse_mix,
    run_simulation,
)
from dispatch.management.policies import integer_in_range
from dispatch.models import AuditRecord
from dispatch.services import agent_authenticate
from orders.models import Order


class Command(BaseCommand):
    help = (
        "Play simulated agent sessions against a running Toolgate (default: the demo server "
        "and the demo agent) and print what happened, by result code and by scenario. "
        f"Scenarios: {', '.join(SCENARIOS)}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--sessions",
            type=integer_in_range(1, 1_000_000, "sessions"),
            required=True,
            help="how many sessions to play",
        )
        parser.add_argument(
            "--base-url", default=DEMO_BASE_URL, help="the server (default %(default)s)"
        )
        parser.add_argument(
            "--token",
            default=demo_token(),
            help="an agent's token (default: $TOOLGATE_DEMO_TOKEN, or the demo token)",
        )
        parser.add_argument(
            "--seed", type=int, default=None, help="replay the same sessions (default: random)"
        )
        parser.add_argument(
            "--mix",
            default=",".join(f"{name}={weight}" for name, weight in DEFAULT_MIX.items()),
            help="scenarios and their weights; those not named are not played "
            "(default %(default)s)",
        )
        parser.add_argument(
            "--concurrency",
            type=integer_in_range(1, 64, "threads"),
            default=1,
            help="sessions played at once (default %(default)s)",
        )
        parser.add_argument(
            "--orders",
            default=None,
            help="the orders to play with, as JSON or @file.json: a list of {order_id, "
            "customer_id, total_cents, currency}; default: the orders in this database",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seed = options["seed"] if options["seed"] is not None else secrets.randbelow(10**6)
        run_id = secrets.token_hex(4)
        sessions: int = options["sessions"]
        step = max(1, sessions // 10)

        def progress(done: int, calls: int) -> None:
            if done % step == 0 or done == sessions:
                self.stderr.write(f"  {done}/{sessions} sessions, {calls} calls")

        try:
            mix = parse_mix(options["mix"])
            orders = self._orders(options["orders"])
            client = ApiClient(base_url=options["base_url"], token=options["token"])
            self.stderr.write(
                f"Playing {sessions} sessions against {client.base_url} "
                f"(run {run_id}, seed {seed})..."
            )
            report = run_simulation(
                client=client,
                orders=orders,
                sessions=sessions,
                mix=mix,
                seed=seed,
                run_id=run_id,
                concurrency=options["concurrency"],
                progress=progress,
            )
        except SimulationError as exc:
            raise CommandError(str(exc)) from None

        self.stdout.write("")
        for line in [*report.lines(), *self._recovery_lines(report, options["token"])]:
            self.stdout.write(line)

    def _recovery_lines(self, report: SimulationReport, token: str) -> list[str]:
        """The recovery rate of the run, read from the audit records as a manager reads it."""
        agent = agent_authenticate(token)
        run = {"at__gte": report.started_at, "at__lt": report.finished_at}
        if agent is None or not AuditRecord.objects.filter(agent=agent, **run).exists():
            return [
                "Recovery rate: not measured here (the audit records of this run are not in "
                "this database; the server's own database has them)."
            ]
        rate = recovery_rate(start=report.started_at, end=report.finished_at, agent_id=agent.pk)
        overall = rate.overall
        lines = [
            f"Recovery rate: {_percent(overall)} ({overall.recovered} of {overall.rejected} "
            f"rejections the model can fix were followed within {RECOVERY_WINDOW} calls of "
            "their session by a call to the same tool that passes).",
        ]
        for title, figures in (("code", rate.by_code), ("tool", rate.by_tool)):
            lines += [
                "",
                f"Recovery by {title}:",
                f"  {title:<28}{'rejected':>9}{'recovered':>10}{'rate':>8}",
            ]
            for name, recovery in figures.items():
                lines.append(
                    f"  {name:<28}{recovery.rejected:>9}{recovery.recovered:>10}"
                    f"{_percent(recovery):>8}"
                )
        return lines

    def _orders(self, source: str | None) -> list[OrderFact]:
        if source is None:
            return [
                OrderFact(*row)
                for row in Order.objects.order_by("order_id").values_list(
                    "order_id", "customer_id", "total_cents", "currency", "refunded_cents"
                )
            ]
        text = source
        if source.startswith("@"):
            try:
                text = Path(source[1:]).read_text(encoding="utf-8")
            except OSError as exc:
                raise SimulationError(f"--orders: cannot read {source[1:]}: {exc}") from None
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise SimulationError(f"--orders is not JSON: {exc}") from None
        return orders_from_json(document)


def _percent(recovery: Recovery) -> str:
    return "-" if recovery.rate is None else f"{100.0 * recovery.rate:.1f}%"

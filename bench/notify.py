"""Benchmark (e): a held call to its messages, and a Slack press to the execution, on a real
Celery worker.

A database of its own (`toolgate_bench_notify`, dropped and created by each run, migrated), Redis
as the broker (`--redis-url`, a database number of its own), one `celery -A toolgate worker`
(the solo pool, as tests/workers.py starts it), a real SMTP server (aiosmtpd) and the Slack Web
API's stand-in of the tests (tests/approvals/notifications/conftest.py) in this process. One
reviewer, with an e-mail address and a linked Slack user.

Measured, each as the median (and p90) of `--calls` held calls, one after the other:

- the agent's held call, with no channel configured (the baseline) and with both: what the
  notification row costs the call (the sending is the worker's, after the commit);
- from the held call's answer to the e-mail read by the SMTP server, and to chat.postMessage
  received by the Slack stand-in;
- from an Approve press POSTed to /approvals/slack/actions, signed as Slack signs it, to the
  confirmation executed by the worker; against the baseline of the same approval made on the
  card (confirmation_approve in this process) to its execution by the same worker.

Run: `.venv/bin/python -m bench.notify [--calls 50] [--pg-url ...] [--redis-url ...] [--json]`.
Needs PostgreSQL at 127.0.0.1:5432 and Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATABASE = "toolgate_bench_notify"


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _figure(values: Sequence[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values) * 1000, 1),
        "p90_ms": round(_percentile(values, 0.9) * 1000, 1),
    }


def _wait(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.002)
    raise SystemExit(f"timed out waiting for {what}")


def _since(items: Any, start: int) -> list[Any]:
    return list(items[start:])


def _posted_since(slack: Any, start: int) -> list[Any]:
    return _since(slack.of("chat.postMessage"), start)


def _database(pg_url: str) -> str:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    return pg_url.rsplit("/", 1)[0] + f"/{DATABASE}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    options = parser.parse_args(argv)

    database_url = _database(options.pg_url)
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": options.redis_url,
            "ALLOWED_HOSTS": "localhost,127.0.0.1",
            "LOG_LEVEL": "WARNING",
        }
    )
    import django

    django.setup()
    import redis
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with redis.Redis.from_url(options.redis_url) as client:
        client.flushdb()

    from tests.approvals.notifications import conftest as stand_ins

    with stand_ins.smtp_stand_in() as smtp, stand_ins.slack_stand_in() as slack:
        figures = _run(options.calls, smtp, slack, stand_ins)
    if options.json:
        print(json.dumps(figures, indent=2))
    elif not options.quiet:
        for name, figure in figures.items():
            print(f"{name:<58} {figure}")
    return figures


def _run(calls: int, smtp: Any, slack: Any, stand_ins: Any) -> dict[str, Any]:
    channels = {
        "TOOLGATE_NOTIFY_EMAIL": "true",
        "EMAIL_HOST": smtp.host,
        "EMAIL_PORT": str(smtp.port),
        "SLACK_BOT_TOKEN": stand_ins.BOT_TOKEN,
        "SLACK_SIGNING_SECRET": stand_ins.SIGNING_SECRET,
        "TOOLGATE_SLACK_TEAM_ID": stand_ins.TEAM_ID,
        "TOOLGATE_SLACK_CHANNEL": stand_ins.CHANNEL_ID,
        "TOOLGATE_SLACK_API_URL": slack.url,
    }
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "toolgate-bench-notify-worker.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "toolgate", "worker"),
                *("--pool", "solo", "--loglevel", "INFO"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            cwd=ROOT,
            env={**os.environ, **channels, "LOG_LEVEL": "INFO"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: b" ready." in log.read_bytes(), "the worker to start", timeout=60)
        return _measure(calls, smtp, slack, channels)
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()


def _measure(calls: int, smtp: Any, slack: Any, channels: dict[str, str]) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from approvals.models import SlackLink
    from approvals.reviewers import REVIEWERS_GROUP
    from approvals.services import confirmation_approve
    from dispatch.models import Confirmation, ConfirmationStatus
    from dispatch.services import agent_create, call_dispatch
    from orders.models import Order
    from tests.approvals.notifications.conftest import button_body, slack_signed

    agent, _ = agent_create(
        name="bench-notify",
        allowed_tools=["get_order", "refund_order"],
        max_amount_cents=50_000,
        auto_approve_below_cents=5_000,
        confirmation_ttl_seconds=3600,
    )
    ana = User.objects.create_user("ana", email="ana@example.test")
    ana.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    SlackLink.objects.create(
        user=ana, team_id=str(channels["TOOLGATE_SLACK_TEAM_ID"]), slack_user_id="U0ANA"
    )
    numbers = iter(range(1_000_000))

    def hold() -> tuple[Confirmation, float]:
        n = next(numbers)
        Order.objects.create(
            order_id=f"ORD-9{n}", customer_id=f"CUS-B{n}", total_cents=10_000, currency="BRL"
        )
        started = time.monotonic()
        result = call_dispatch(
            agent=agent,
            session_id=f"s-{n}",
            customer_id=f"CUS-B{n}",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": f"ORD-9{n}",
                    "amount_cents": 6_000,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )
        assert result.code == "CONFIRMATION_REQUIRED", result.message
        answered = time.monotonic()
        confirmation = Confirmation.objects.get(pk=result.data["confirmation_id"])
        return confirmation, answered - started

    def executed(confirmation: Confirmation) -> bool:
        status = Confirmation.objects.values_list("status", flat=True).get(pk=confirmation.pk)
        return bool(status == ConfirmationStatus.EXECUTED)

    # The held call alone: no channel in this process's settings.
    settings.TOOLGATE_NOTIFY_EMAIL = False
    settings.SLACK_BOT_TOKEN = ""
    alone = [hold()[1] for _ in range(calls)]

    for name, value in channels.items():
        setattr(settings, name, value == "true" if value == "true" else value)
    settings.EMAIL_PORT = int(channels["EMAIL_PORT"])
    with_channels: list[float] = []
    to_mail: list[float] = []
    to_slack: list[float] = []
    held: list[Confirmation] = []
    for _ in range(calls):
        mails, posts = len(smtp.received), len(slack.of("chat.postMessage"))
        started = time.monotonic()
        confirmation, took = hold()
        answered = started + took
        with_channels.append(took)
        mail = _wait(partial(_since, smtp.received, mails), "the e-mail")[0]
        post = _wait(partial(_posted_since, slack, posts), "the Slack message")[0]
        to_mail.append(mail.at - answered)
        to_slack.append(post.at - answered)
        held.append(confirmation)

    # Decisions on the card (the baseline) and from Slack, alternating, each to its execution.
    by_page: list[float] = []
    by_slack: list[float] = []
    client = Client(SERVER_NAME="localhost")
    for index, confirmation in enumerate(held):
        started = time.monotonic()
        if index % 2:
            body = button_body(confirmation.pk, slack_user_id="U0ANA")
            answer = client.post(
                "/approvals/slack/actions",
                data=body,
                content_type="application/x-www-form-urlencoded",
                headers=slack_signed(body),
            )
            assert answer.status_code == 200, answer.content
            _wait(partial(executed, confirmation), "the execution from Slack")
            by_slack.append(time.monotonic() - started)
        else:
            confirmation_approve(confirmation_id=confirmation.pk, reviewer=ana)
            _wait(partial(executed, confirmation), "the execution from the card")
            by_page.append(time.monotonic() - started)

    return {
        "held call, no channel (baseline)": _figure(alone),
        "held call, e-mail and Slack configured": _figure(with_channels),
        "hold answered -> e-mail read by the SMTP server": _figure(to_mail),
        "hold answered -> chat.postMessage at the Slack stand-in": _figure(to_slack),
        "approval on the card -> executed by the worker (baseline)": _figure(by_page),
        "Approve pressed in Slack -> executed by the worker": _figure(by_slack),
        "calls": {"held": calls, "decided": len(by_page) + len(by_slack)},
    }


if __name__ == "__main__":
    main()

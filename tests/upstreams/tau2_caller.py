"""One Toolgate process calling τ²'s retail server, as a gunicorn or Celery worker process does:
Django on the test's PostgreSQL database, the upstream declared by TOOLGATE_UPSTREAMS (so its own
server process, started here), and the calls of a plan sent through the pipeline once a start
file appears (tests/upstreams/test_tau2_processes.py).

    python -m tests.upstreams.tau2_caller PLAN.json

Prints one JSON line: each call's outcome, how many calls this process sent the server, and
how many times the store answered a call with StoreUnavailable (a 503 through the API).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(plan_file: str) -> None:
    import django

    django.setup()
    from dispatch.models import Agent
    from dispatch.pipeline.state import StoreUnavailable
    from dispatch.services import call_dispatch
    from upstreams.mcp import McpUpstream
    from upstreams.registry import loaded

    plan = json.loads(Path(plan_file).read_text())
    upstream = loaded["tau2_retail"][0]
    assert isinstance(upstream, McpUpstream)
    upstream.listed()  # its server started before the calls race
    sent = 0
    call = upstream.call

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        return call(*args, **kwargs)

    upstream.call = counted  # type: ignore[method-assign]
    agent = Agent.objects.get(pk=plan["agent"])
    print("READY", flush=True)
    start = Path(plan["start"])
    while not start.exists():
        time.sleep(0.005)
    outcomes = []
    unavailable = 0
    for planned in plan["calls"]:
        # An identical call executing elsewhere is answered CALL_IN_PROGRESS, and a store that
        # could not record the call 503 (StoreUnavailable): a host sends it again.
        for _ in range(200):
            try:
                result = call_dispatch(
                    agent=agent,
                    session_id=planned["session"],
                    customer_id=plan["customer"],
                    tool=planned["tool"],
                    arguments=json.dumps(planned["arguments"]),
                )
            except StoreUnavailable:
                unavailable += 1
                time.sleep(0.02)
                continue
            if result.code != "CALL_IN_PROGRESS":
                break
            time.sleep(0.02)
        outcomes.append(
            {
                "tool": planned["tool"],
                "arguments": planned["arguments"],
                "ok": result.ok,
                "code": result.code,
                "replayed": result.replayed,
            }
        )
    upstream.close()
    report = {"outcomes": outcomes, "sent": sent, "unavailable": unavailable}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate.settings.local")
    main(sys.argv[1])

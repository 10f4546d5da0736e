"""A Toolgate process of its own for the upstream tests: it calls a tool through the pipeline,
or settles outcomes, against the test's PostgreSQL database, then prints what it got as JSON.

    python -m tests.upstreams.caller call --agent ID --customer C --session S --tool T --arguments J
    python -m tests.upstreams.caller settle

The payments upstream is registered in the variant TOOLGATE_TEST_PAYMENTS_HONOURS (1 or 0) names,
its address and token from the environment, as a deployment's would be. A test kills it mid-call
(SIGKILL) or runs two at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate.settings.test")
    import django

    django.setup()
    from dispatch.models import Agent
    from dispatch.outcomes import outcomes_settle
    from dispatch.registry import tool_registry
    from dispatch.services import call_dispatch
    from tests.upstreams import payments
    from upstreams.registry import upstream_register

    honours = os.environ.get("TOOLGATE_TEST_PAYMENTS_HONOURS", "1") == "1"
    payments.UPSTREAM = payments.payments_upstream(honours_idempotency_key=honours)
    upstream_register(payments, tool_registry)

    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["call", "settle"])
    parser.add_argument("--agent", type=int)
    parser.add_argument("--customer", default="cust-1")
    parser.add_argument("--session", default="s-1")
    parser.add_argument("--tool", default="refund_payment")
    parser.add_argument("--arguments", default="{}")
    options = parser.parse_args()
    if options.what == "settle":
        # Told when it may start: the test starts two at once.
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        sys.stdin.readline()
        settled = outcomes_settle(older_than=timedelta(0))
        sys.stdout.write(json.dumps([[s.key, s.status] for s in settled]) + "\n")
        return
    result = call_dispatch(
        agent=Agent.objects.select_related("current_policy").get(pk=options.agent),
        session_id=options.session,
        customer_id=options.customer,
        tool=options.tool,
        arguments=options.arguments,
    )
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")


if __name__ == "__main__":
    main()

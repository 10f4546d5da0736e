"""GET /api/v1/metrics: the dashboard's figures, for managers only."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from dispatch.services import call_dispatch
from tests.conftest import AgentClient, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

REFUND = {"order_id": "ORD-1001", "currency": "BRL", "reason": "damaged"}


@pytest.fixture
def manager(db: None) -> Client:
    user = User.objects.create_user("maria", password="pw")
    user.groups.add(Group.objects.get_or_create(name="managers")[0])
    client = Client()
    client.force_login(user)
    return client


def test_a_manager_reads_the_figures_of_the_calls(make_agent: MakeAgent, manager: Client) -> None:
    agent, _ = make_agent()
    for arguments in ({"order_id": 1001}, {"order_id": "ORD-1001"}):
        call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="get_order",
            arguments=json.dumps(arguments),
        )

    response = manager.get("/api/v1/metrics", {"agent": str(agent.pk), "tool": "get_order"})

    assert response.status_code == 200
    total = response.json()["calls"]["total"]
    assert (total["calls"], total["rejected"], total["recovery_rate"]) == (2, 1, 1.0)


def test_a_reviewer_who_is_not_a_manager_gets_403(db: None) -> None:
    reviewer = User.objects.create_user("rui", password="pw")
    client = Client()
    client.force_login(reviewer)

    response = client.get("/api/v1/metrics")

    assert response.status_code == 403
    assert response.json()["error"]["status"] == 403


def test_an_agent_token_opens_nothing_here(api: AgentClient) -> None:
    response = api.http.get(f"{api.base_url}/api/v1/metrics", headers=api.headers())

    assert response.status_code in {401, 403}


def test_a_bad_range_is_a_clear_400(manager: Client) -> None:
    response = manager.get("/api/v1/metrics", {"since": "yesterday"})

    assert response.status_code == 400
    assert "ISO 8601" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "query", "named"),
    [
        ("/api/v1/metrics", {"agent": "\u00b2"}, "agent"),
        ("/api/v1/metrics", {"agent": "9" * 30}, "agent"),
        ("/api/v1/metrics", {"agnt": "1"}, "query"),
        ("/api/v1/metrics", {"agent": "0"}, "agent"),
        ("/api/v1/metrics", {"tool": "get\x00order"}, "tool"),
        ("/api/v1/metrics/what-if", {"agent": "\u0661"}, "agent"),
        ("/api/v1/metrics/what-if", {"agent": "1", "BRL_max": "5"}, "query"),
    ],
)
def test_an_agent_id_or_a_parameter_that_is_not_one_is_a_clear_400(
    manager: Client, path: str, query: dict[str, str], named: str
) -> None:
    response = manager.get(path, query)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith(f"{named}:")


def test_a_manager_asks_what_a_looser_policy_would_have_done(
    make_agent: MakeAgent, manager: Client
) -> None:
    agent, _ = make_agent()
    for session, amount in (("s-1", 3_000), ("s-2", 6_000)):
        call_dispatch(
            agent=agent,
            session_id=session,
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": "ORD-1001",
                    "amount_cents": amount,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )

    response = manager.get(
        "/api/v1/metrics/what-if",
        # Per currency, in its major units: 100.00 BRL.
        {"agent": str(agent.pk), "BRL_auto_approve_below": "100"},
    )

    assert response.status_code == 200
    body = response.json()
    assert body["policy"]["currencies"]["BRL"]["auto_approve_below_cents"] == 5_000
    assert body["draft"]["currencies"]["BRL"]["auto_approve_below_cents"] == 10_000
    assert body["draft"]["currencies"]["USD"]["auto_approve_below_cents"] == 5_000
    outcomes = {row["outcome"]: row for row in body["outcomes"]}
    assert outcomes["one_reviewer"]["actual"] == {"calls": 1, "cents": {"BRL": 6_000}}
    assert outcomes["auto_executed"]["what_if"] == {"calls": 2, "cents": {"BRL": 9_000}}
    [move] = body["moves"]
    assert (move["from"], move["to"], move["calls"]) == ("one_reviewer", "auto_executed", 1)
    assert move["examples"][0]["amount_cents"] == 6_000


def test_a_what_if_with_a_bad_value_is_a_clear_400(make_agent: MakeAgent, manager: Client) -> None:
    agent, _ = make_agent()

    response = manager.get(
        "/api/v1/metrics/what-if", {"agent": str(agent.pk), "BRL_daily_cap": "-5"}
    )

    assert response.status_code == 400
    assert "BRL_daily_cap" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("auto_approve_window_seconds", "5"),
        ("BRL_max_amount", ""),
        ("BRL_max_amount", "9" * 30),
        # Finer than the currency's smallest unit: not silently rounded.
        ("BRL_auto_approve_below", "50.505"),
        ("JPY_auto_approve_below", "50.5"),
    ],
)
def test_a_draft_value_out_of_range_is_a_clear_400(
    make_agent: MakeAgent, manager: Client, name: str, value: str
) -> None:
    agent, _ = make_agent()

    response = manager.get("/api/v1/metrics/what-if", {"agent": str(agent.pk), name: value})

    assert response.status_code == 400
    assert name in response.json()["error"]["message"]


def test_an_empty_two_reviewer_amount_means_one_reviewer_is_enough(
    make_agent: MakeAgent, manager: Client
) -> None:
    agent, _ = make_agent()

    response = manager.get(
        "/api/v1/metrics/what-if", {"agent": str(agent.pk), "BRL_two_reviewers_from": ""}
    )

    assert response.status_code == 200
    assert response.json()["draft"]["currencies"]["BRL"]["two_reviewers_from_cents"] is None


def test_a_draft_may_give_thresholds_to_a_currency_held_today(
    make_agent: MakeAgent, manager: Client
) -> None:
    agent, _ = make_agent()

    response = manager.get(
        "/api/v1/metrics/what-if",
        {"agent": str(agent.pk), "JPY_max_amount": "30000", "JPY_auto_approve_below": "2000"},
    )
    without_maximum = manager.get(
        "/api/v1/metrics/what-if", {"agent": str(agent.pk), "KWD_auto_approve_below": "1.250"}
    )

    assert response.status_code == 200
    assert response.json()["policy"]["currencies"]["JPY"] is None
    # Whole yen are JPY's minor units.
    assert response.json()["draft"]["currencies"]["JPY"]["max_amount_cents"] == 30_000
    assert response.json()["draft"]["currencies"]["JPY"]["auto_approve_below_cents"] == 2_000
    assert without_maximum.status_code == 400
    assert "KWD a maximum amount first" in without_maximum.json()["error"]["message"]


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("JPY_auto_approve_below", "50.5", "50.5 JPY is finer than its smallest unit (0 decimals)"),
        ("USD_max_amount", "50.555", "50.555 USD is finer than its smallest unit (2 decimals)"),
        ("BRL_daily_cap", "-5", "-5 is not an amount of money (0 or more)"),
        ("BRL_auto_approve_below", "fifty", "'fifty' is not an amount"),
        ("BRL_max_amount", "1" + "0" * 20, "must be at most 92233720368547758.07 BRL"),
        ("XYZ_max_amount", "100", "XYZ is not a currency of this agent's tools or policy"),
        ("BRL_auto_approve_bellow", "100", "query: unknown parameter 'BRL_auto_approve_bellow'"),
        ("auto_approve_below", "100", "query: unknown parameter 'auto_approve_below'"),
    ],
)
def test_a_draft_it_cannot_read_is_a_400_naming_the_parameter(
    make_agent: MakeAgent, manager: Client, name: str, value: str, said: str
) -> None:
    agent, _ = make_agent()

    response = manager.get("/api/v1/metrics/what-if", {"agent": str(agent.pk), name: value})

    assert response.status_code == 400
    error = response.json()["error"]
    # A name the what-if does not take is refused with the API's other unknown parameters.
    assert (said if said.startswith("query:") else f"{name}: {said}") in error["message"]

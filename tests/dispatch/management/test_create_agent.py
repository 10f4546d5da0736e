from __future__ import annotations

import re

import pytest
from django.core.management.base import CommandError
from django.test import Client

from dispatch.models import Agent
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import agent_authenticate, token_hash
from tests.conftest import Run, printed_token

pytestmark = pytest.mark.django_db


def test_it_prints_a_token_that_authenticates_and_stores_only_its_hash(
    run: Run, client: Client
) -> None:
    output = run("create_agent", "support-bot", "--tools", "get_order", "refund_order")

    token = printed_token(output)
    agent = Agent.objects.get(name="support-bot")
    assert agent_authenticate(token) == agent
    assert agent.token_hash == token_hash(token) != token
    assert agent.token_prefix == token[:10]
    assert "will not be shown again" in output
    response = client.get("/api/v1/tools", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200
    assert [tool["name"] for tool in response.json()["tools"]] == ["get_order", "refund_order"]


def test_it_creates_the_first_policy_version_with_sensible_defaults(run: Run) -> None:
    output = run("create_agent", "reader", "--tools", "get_order")

    policy = Agent.objects.get(name="reader").current_policy
    assert policy is not None
    assert (policy.version, policy.allowed_tools) == (1, ["get_order"])
    # The defaults, 500.00 a call, 50.00 without a human, two reviewers from 300.00, in each
    # default currency's own minor units.
    defaults = CurrencyLimits(50_000, 5_000, 30_000, None)
    assert policy.limits() == {"BRL": defaults, "EUR": defaults, "USD": defaults}
    assert (policy.step_budget, policy.repeat_limit, policy.confirmation_ttl_seconds) == (
        50,
        3,
        86_400,
    )
    assert "Policy v1 of reader:" in output
    assert "BRL" in output and "max 500.00 BRL a call" in output
    assert "other currencies" in output and "held for a human" in output
    assert "86400 s (24 h)" in output


def test_it_takes_every_limit_from_the_command_line(run: Run) -> None:
    run(
        "create_agent",
        "strict-bot",
        "--tools",
        "refund_order",
        "--max-amount",
        "BRL:200",
        "JPY:30000",
        "KWD:60.5",
        "--auto-approve-below",
        "BRL:0",
        "JPY:5000",
        "--two-reviewers-from",
        "BRL:none",
        "--daily-cap",
        "KWD:12.250",
        "--human",
        "refund_order:always",
        "--step-budget",
        "10",
        "--repeat-limit",
        "1",
        "--confirmation-ttl-seconds",
        "600",
    )

    policy = Agent.objects.get(name="strict-bot").current_policy
    assert policy is not None
    # Each in its currency's minor units: JPY has none, KWD three decimals.
    assert policy.limits() == {
        "BRL": CurrencyLimits(20_000, 0, None, None),
        "JPY": CurrencyLimits(30_000, 5_000, 300, None),
        "KWD": CurrencyLimits(60_500, 50_000, 300_000, 12_250),
    }
    assert policy.human_rules == {"refund_order": "always"}
    assert (policy.step_budget, policy.repeat_limit, policy.confirmation_ttl_seconds) == (
        10,
        1,
        600,
    )


def test_it_refuses_a_name_that_is_taken(run: Run) -> None:
    run("create_agent", "support-bot", "--tools", "get_order")

    with pytest.raises(CommandError, match="already exists"):
        run("create_agent", "support-bot", "--tools", "get_order")

    assert Agent.objects.count() == 1


def test_it_refuses_unknown_tools_and_creates_nothing(run: Run) -> None:
    with pytest.raises(CommandError, match=r"Unknown tools: delete_order\. The tools are: "):
        run("create_agent", "support-bot", "--tools", "get_order", "delete_order")

    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-amount", "BRL:25.901"),
        ("--max-amount", "JPY:25.5"),
        ("--max-amount", "BRL:0"),
        ("--max-amount", "50"),
        ("--auto-approve-below", "BRL:-1"),
        ("--two-reviewers-from", "BRL:many"),
        ("--human", "refund_order:sometimes"),
        ("--step-budget", "0"),
        ("--repeat-limit", "3.5"),
        ("--confirmation-ttl-seconds", "30"),
    ],
)
def test_it_refuses_bad_numbers(run: Run, option: str, value: str) -> None:
    with pytest.raises(CommandError, match=option.removeprefix("--")):
        run("create_agent", "support-bot", "--tools", "get_order", option, value)

    assert not Agent.objects.exists()


def test_it_sets_a_webhook_and_prints_its_secret_once(run: Run) -> None:
    output = run(
        "create_agent",
        "hooked-bot",
        "--tools",
        "refund_order",
        "--webhook-url",
        "https://93.184.215.14/toolgate",
    )

    agent = Agent.objects.get(name="hooked-bot")
    match = re.search(r"^Webhook secret: (\S+)$", output, re.M)
    assert match is not None, output
    assert agent.webhook_url == "https://93.184.215.14/toolgate"
    assert agent.webhook_secret == match.group(1)
    assert "shown once" in output


def test_it_refuses_a_private_webhook_url_and_creates_nothing(run: Run) -> None:
    with pytest.raises(CommandError, match=r"--webhook-url: .*not a public address"):
        run(
            "create_agent",
            "hooked-bot",
            "--tools",
            "refund_order",
            "--webhook-url",
            "https://169.254.169.254/latest",
        )

    assert not Agent.objects.exists()

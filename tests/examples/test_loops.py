"""examples/openai_loop.py and examples/anthropic_loop.py, run as a user runs them, against a live
Toolgate and a provider answering from a script: the model sends a float amount, reads the hint,
corrects it, the refund is held, a reviewer approves it while the example waits, and the model is
told the outcome."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from anthropic.types import Message
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from django.contrib.auth.models import Group, User
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from pytest_django.live_server_helper import LiveServer

from approvals.reviewers import REVIEWERS_GROUP, reviewer_token_create
from dispatch.models import AuditRecord, Confirmation
from tests.conftest import Ledger, MakeAgent
from tests.examples.conftest import FakeProvider, ServeProvider, documented, typed_dict_check

pytestmark = pytest.mark.usefixtures("orders")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HELD = re.compile(r"^Held for a reviewer: (\S+/approvals/([0-9a-f]+)/)$")
FLOAT_REFUND = (
    '{"order_id": "ORD-1001", "amount_cents": 80.90, "currency": "BRL", "reason": "damaged"}'
)
REFUND = '{"order_id": "ORD-1001", "amount_cents": 8090, "currency": "BRL", "reason": "damaged"}'


@dataclass
class Run:
    returncode: int
    stdout: str
    review_url: str


@pytest.fixture
def reviewer_token(db: None) -> str:
    user = User.objects.create_user("rita", password="pw-rita")
    user.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    return reviewer_token_create(user=user)


def run_example(
    script: str, env: dict[str, str], live_server: LiveServer, reviewer_token: str
) -> Run:
    """Run the example; when it says a refund is held, approve it as a reviewer on the API."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_", "TOOLGATE_"))
    }
    environment.update(env, PYTHONUNBUFFERED="1", NO_PROXY="127.0.0.1,localhost")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / script)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    timer = threading.Timer(120, process.kill)
    timer.start()
    lines, review_url = [], ""
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            held = HELD.match(line.strip())
            if held:
                review_url = held.group(1)
                approved = requests.post(
                    f"{live_server.url}/api/v1/confirmations/{held.group(2)}/approve",
                    headers={"Authorization": f"Token {reviewer_token}"},
                    timeout=30,
                )
                assert approved.status_code == 200, approved.text
        returncode = process.wait()
    finally:
        timer.cancel()
        process.kill()
    return Run(returncode, "".join(lines), review_url)


def toolgate_env(live_server: LiveServer, token: str) -> dict[str, str]:
    return {"TOOLGATE_URL": live_server.url, "TOOLGATE_TOKEN": token, "TOOLGATE_CUSTOMER": "CUS-1"}


def assert_one_refund_and_its_audit(ledger: Ledger) -> None:
    assert ledger.state() == (1, 8090)
    codes = list(AuditRecord.objects.order_by("at").values_list("code", flat=True))
    assert codes == ["INVALID_ARGUMENTS", "CONFIRMATION_REQUIRED"]
    (confirmation,) = Confirmation.objects.all()
    assert confirmation.status == "executed"


# OpenAI: Chat Completions ---------------------------------------------------------------------


def chat_completion(number: int, message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    answer = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": 1_780_000_000 + number,
        "model": "gpt-5.4-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "refusal": None, **message},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }
    documented(ChatCompletion.model_validate(answer))
    return answer


def tool_call(number: int, arguments: str) -> dict[str, Any]:
    return chat_completion(
        number,
        {
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{number}",
                    "type": "function",
                    "function": {"name": "refund_order", "arguments": arguments},
                }
            ],
        },
        "tool_calls",
    )


def test_the_openai_loop_corrects_a_float_and_waits_for_the_reviewer(
    live_server: LiveServer,
    make_agent: MakeAgent,
    reviewer_token: str,
    serve_provider: ServeProvider,
    ledger: Ledger,
) -> None:
    provider = serve_provider(
        FakeProvider(
            path="/v1/chat/completions",
            check_request=typed_dict_check(CompletionCreateParamsNonStreaming, "messages", "tools"),
            answers=deque(
                [
                    tool_call(1, FLOAT_REFUND),
                    tool_call(2, REFUND),
                    chat_completion(
                        3, {"content": "Refunded R$ 80,90 to ORD-1001."}, finish_reason="stop"
                    ),
                ]
            ),
        )
    )
    env = {
        **toolgate_env(live_server, make_agent()[1]),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": f"{provider.url}/v1",
    }

    run = run_example("openai_loop.py", env, live_server, reviewer_token)

    assert run.returncode == 0, run.stdout
    assert provider.problems == []
    assert all(headers["authorization"] == "Bearer sk-test" for headers in provider.headers)
    first, second, third = provider.requests
    assert first["model"] == "gpt-5.4-mini"
    assert [tool["function"]["name"] for tool in first["tools"]] == ["get_order", "refund_order"]
    hint = second["messages"][-1]
    assert (hint["role"], hint["tool_call_id"]) == ("tool", "call_1")
    assert hint["content"].startswith("ERROR INVALID_ARGUMENTS refund_order: amount_cents:")
    assert "such as 8090 for 80.90" in hint["content"]
    outcome = third["messages"][-1]
    assert (outcome["role"], outcome["tool_call_id"]) == ("tool", "call_2")
    assert outcome["content"].startswith("OK refund_order: ")
    assert run.review_url.startswith(f"{live_server.url}/approvals/")
    assert "Decided: executed" in run.stdout
    assert "Model: Refunded R$ 80,90 to ORD-1001." in run.stdout
    assert_one_refund_and_its_audit(ledger)


# Anthropic: the Messages API ------------------------------------------------------------------


def message(number: int, content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    answer = {
        "id": f"msg_{number:024d}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }
    documented(Message.model_validate(answer))
    return answer


def tool_use(number: int, amount_cents: float | int) -> dict[str, Any]:
    arguments = {
        "order_id": "ORD-1001",
        "amount_cents": amount_cents,
        "currency": "BRL",
        "reason": "damaged",
    }
    return message(
        number,
        [
            {"type": "text", "text": "Let me refund that."},
            {
                "type": "tool_use",
                "id": f"toolu_{number}",
                "name": "refund_order",
                "input": arguments,
            },
        ],
        "tool_use",
    )


def test_the_anthropic_loop_corrects_a_float_and_waits_for_the_reviewer(
    live_server: LiveServer,
    make_agent: MakeAgent,
    reviewer_token: str,
    serve_provider: ServeProvider,
    ledger: Ledger,
) -> None:
    provider = serve_provider(
        FakeProvider(
            path="/v1/messages",
            check_request=typed_dict_check(MessageCreateParamsNonStreaming, "messages", "tools"),
            answers=deque(
                [
                    tool_use(1, 80.9),
                    tool_use(2, 8090),
                    message(
                        3, [{"type": "text", "text": "Refunded R$ 80,90."}], stop_reason="end_turn"
                    ),
                ]
            ),
        )
    )
    env = {
        **toolgate_env(live_server, make_agent()[1]),
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": provider.url,
    }

    run = run_example("anthropic_loop.py", env, live_server, reviewer_token)

    assert run.returncode == 0, run.stdout
    assert provider.problems == []
    # Sent as x-api-key or, by newer SDKs, as a bearer token.
    assert all(
        "sk-ant-test" in (headers.get("x-api-key", ""), headers.get("authorization", "")[7:])
        for headers in provider.headers
    )
    first, second, third = provider.requests
    assert first["model"] == "claude-sonnet-5-5"
    assert [tool["name"] for tool in first["tools"]] == ["get_order", "refund_order"]
    assert set(first["tools"][1]) == {"name", "description", "input_schema"}
    (hint,) = second["messages"][-1]["content"]
    assert (hint["type"], hint["tool_use_id"], hint["is_error"]) == (
        "tool_result",
        "toolu_1",
        True,
    )
    assert hint["content"].startswith("ERROR INVALID_ARGUMENTS refund_order: amount_cents:")
    assert "such as 8090 for 80.90" in hint["content"]
    (outcome,) = third["messages"][-1]["content"]
    assert (outcome["tool_use_id"], outcome["is_error"]) == ("toolu_2", False)
    assert outcome["content"].startswith("OK refund_order: ")
    assert run.review_url.startswith(f"{live_server.url}/approvals/")
    assert "Decided: executed" in run.stdout
    assert "Model: Refunded R$ 80,90." in run.stdout
    assert_one_refund_and_its_audit(ledger)


@pytest.mark.parametrize(
    ("script", "env", "missing"),
    [
        ("openai_loop.py", {"OPENAI_API_KEY": "sk-test"}, "TOOLGATE_TOKEN"),
        ("anthropic_loop.py", {"ANTHROPIC_API_KEY": "sk-ant-test"}, "TOOLGATE_TOKEN"),
        ("openai_loop.py", {"TOOLGATE_TOKEN": "tg_x"}, "OPENAI_API_KEY"),
        ("anthropic_loop.py", {"TOOLGATE_TOKEN": "tg_x"}, "ANTHROPIC_API_KEY"),
    ],
)
def test_an_example_without_a_key_says_which_and_where_it_comes_from(
    script: str, env: dict[str, str], missing: str
) -> None:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_", "TOOLGATE_"))
    }
    environment.update(env, TOOLGATE_URL="http://127.0.0.1:9")

    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 1
    assert run.stderr.startswith(f"Set {missing}: ")
    assert "Traceback" not in run.stderr

"""The agent API's documented examples are real: each request, sent through the API on the
setting toolgate/api_examples.py describes, gets the documented answer (ids and times aside), and
the OpenAPI document carries every one of them.

TOOLGATE_WRITE_API_EXAMPLES=1 writes the answers file from this run instead of checking it.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from dispatch.services import agent_create
from tests.factories import OrderFactory
from toolgate.api_examples import ANSWERS_FILE, CALL_EXAMPLES, call_answers

pytestmark = pytest.mark.django_db

WRITE = os.environ.get("TOOLGATE_WRITE_API_EXAMPLES") == "1"
# What differs from run to run: ids (32 hex digits, and the ledger's refund ids, which a
# database's sequence numbers) and moments.
_ID = re.compile(r"\b[0-9a-f]{32}\b|\bRF-\d+\b")
_MOMENT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)")


def normal(answer: dict[str, Any]) -> Any:
    text = json.dumps(answer, sort_keys=True)
    return json.loads(_MOMENT.sub("<moment>", _ID.sub("<id>", text)))


@pytest.fixture
def answers(db: None) -> dict[str, dict[str, Any]]:
    """Every example's request sent through the API, in order, on the documented setting."""
    OrderFactory.create(order_id="ORD-1001", customer_id="CUS-1", total_cents=12_000)
    OrderFactory.create(order_id="ORD-1003", customer_id="CUS-1", total_cents=100_000)
    _, token = agent_create(
        name="support-bot",
        allowed_tools=["get_order", "refund_order"],
        max_amount_cents=50_000,
        auto_approve_below_cents=5_000,
        two_reviewers_from_cents=30_000,
        repeat_limit=3,
    )
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")

    def send(body: dict[str, Any]) -> dict[str, Any]:
        response = client.post("/api/v1/calls", body, content_type="application/json")
        assert response.status_code == 200, response.content
        answer: dict[str, Any] = response.json()
        return answer

    got = {}
    for example in CALL_EXAMPLES:
        for earlier in example.before:
            send(earlier)
        got[example.key] = send(example.request)
    return got


def test_every_example_gets_its_documented_answer(answers: dict[str, dict[str, Any]]) -> None:
    if WRITE:
        ANSWERS_FILE.write_text(json.dumps(answers, indent=2, ensure_ascii=False) + "\n")
    documented = call_answers()

    assert set(documented) == {example.key for example in CALL_EXAMPLES}
    for key, answer in answers.items():
        assert normal(answer) == normal(documented[key]), key


def test_the_examples_cover_each_kind_of_answer() -> None:
    documented = call_answers()

    assert documented["ok"]["ok"] is True
    assert documented["replayed"]["replayed"] is True
    assert documented["held"]["code"] == "CONFIRMATION_REQUIRED"
    assert documented["held"]["data"]["status"] == "pending"
    rejected = {answer["code"] for answer in documented.values() if not answer["ok"]}
    assert {
        "UNKNOWN_TOOL",
        "INVALID_JSON",
        "INVALID_ARGUMENTS",
        "LOOP_DETECTED",
        "CURRENCY_MISMATCH",
        "POLICY_LIMIT",
        "CONFIRMATION_REQUIRED",
    } <= rejected
    # The held call's example shows `context`.
    held = next(example for example in CALL_EXAMPLES if example.key == "held")
    assert held.request["context"]


def test_the_openapi_document_carries_every_example(tmp_path: Any) -> None:
    target = tmp_path / "openapi.json"
    call_command("spectacular", "--format", "openapi-json", "--file", str(target))

    document = json.loads(target.read_text())
    operation = document["paths"]["/api/v1/calls"]["post"]
    requests = operation["requestBody"]["content"]["application/json"]["examples"]
    responses = operation["responses"]["200"]["content"]["application/json"]["examples"]
    assert [example["value"] for example in requests.values()] == [
        example.request for example in CALL_EXAMPLES
    ]
    assert len(responses) == len(CALL_EXAMPLES)
    assert {value["value"]["code"] for value in responses.values()} >= {"OK", "LOOP_DETECTED"}
    approve = document["paths"]["/api/v1/confirmations/{confirmation_id}/approve"]["post"]
    assert {"confirmed": True} in [
        example["value"]
        for example in approve["requestBody"]["content"]["application/json"]["examples"].values()
    ]

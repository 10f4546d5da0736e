"""The OpenAPI schema is valid, served, and describes what the API really answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from jsonschema import Draft202012Validator
from pytest_django.live_server_helper import LiveServer

from approvals.reviewers import reviewer_token_create
from tests.conftest import AgentClient

OPERATIONS = {
    ("/api/v1/calls", "post"),
    ("/api/v1/tools", "get"),
    ("/api/v1/codes", "get"),
    ("/api/v1/sessions/{session_id}/calls", "get"),
    ("/api/v1/confirmations/{confirmation_id}", "get"),
    ("/api/v1/confirmations/{confirmation_id}/approve", "post"),
    ("/api/v1/confirmations/{confirmation_id}/reject", "post"),
    ("/api/v1/confirmations/{confirmation_id}/withdraw", "post"),
    ("/api/v1/metrics", "get"),
    ("/api/v1/metrics/what-if", "get"),
}


def test_the_schema_generates_without_errors_or_warnings(tmp_path: Path) -> None:
    target = tmp_path / "openapi.yaml"

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))

    document = yaml.safe_load(target.read_text())
    assert document["openapi"] == "3.1.0"
    assert {(path, method) for path, item in document["paths"].items() for method in item} == (
        OPERATIONS
    )


@pytest.fixture
def served(live_server: LiveServer) -> dict[str, Any]:
    response = requests.get(
        f"{live_server.url}/api/schema/",
        headers={"Accept": "application/vnd.oai.openapi+json"},
        timeout=30,
    )
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def test_the_schema_is_served_without_a_token(served: dict[str, Any]) -> None:
    assert served["info"]["title"] == "Toolgate API"
    assert served["components"]["securitySchemes"]["AgentToken"]["name"] == "Authorization"
    calls = served["paths"]["/api/v1/calls"]["post"]
    assert set(calls["requestBody"]["content"]) == {"application/json"}
    assert {"200", "400", "401", "409", "413", "422", "429"} <= set(calls["responses"])


def test_the_idempotency_key_header_is_documented(served: dict[str, Any]) -> None:
    parameters = served["paths"]["/api/v1/calls"]["post"]["parameters"]

    (header,) = [p for p in parameters if p["in"] == "header" and p["name"] == "Idempotency-Key"]
    assert header.get("required", False) is False
    assert header["schema"] == {"type": "string", "pattern": "^[\\x20-\\x7e]{1,255}$"}
    assert "session_id" in header["description"]


def test_the_tool_formats_are_documented(served: dict[str, Any]) -> None:
    operation = served["paths"]["/api/v1/tools"]["get"]

    (shape,) = [p for p in operation["parameters"] if p["name"] == "format"]
    assert shape["schema"]["enum"] == ["anthropic", "neutral", "openai", "responses"]
    assert shape["schema"]["default"] == "neutral"
    assert '"strict": true' in shape["description"]
    assert "400" in operation["responses"]


def test_the_yaml_schema_is_served_too(live_server: LiveServer) -> None:
    response = requests.get(f"{live_server.url}/api/schema/", timeout=30)

    assert response.status_code == 200
    assert yaml.safe_load(response.text)["info"]["title"] == "Toolgate API"


def validator(document: dict[str, Any], path: str, method: str, status: str) -> Any:
    content = document["paths"][path][method]["responses"][status]["content"]
    schema = {**content["application/json"]["schema"], "components": document["components"]}
    return Draft202012Validator(schema)


@pytest.mark.usefixtures("orders")
def test_real_answers_match_the_schema(served: dict[str, Any], api: AgentClient) -> None:
    held = api.refund(6000)
    api.post_call("get_order", {"order_id": "ORD-1001"}, headers={"Idempotency-Key": "k"})
    answers = [
        ("/api/v1/calls", "post", "200", api.refund(1000)),
        ("/api/v1/calls", "post", "200", held),
        ("/api/v1/calls", "post", "200", api.call("refund_order", "nope")),
        ("/api/v1/calls", "post", "400", api.post_body("nope").json()),
        (
            "/api/v1/calls",
            "post",
            "422",
            api.post_call(
                "get_order", {"order_id": "ORD-1002"}, headers={"Idempotency-Key": "k"}
            ).json(),
        ),
        ("/api/v1/tools", "get", "200", api.get("/api/v1/tools", format="openai").json()),
        ("/api/v1/tools", "get", "400", api.get("/api/v1/tools", format="x").json()),
        ("/api/v1/codes", "get", "200", api.get("/api/v1/codes").json()),
        (
            "/api/v1/sessions/{session_id}/calls",
            "get",
            "200",
            api.get("/api/v1/sessions/s-1/calls").json(),
        ),
        (
            "/api/v1/sessions/{session_id}/calls",
            "get",
            "404",
            api.get("/api/v1/sessions/none/calls").json(),
        ),
        (
            "/api/v1/confirmations/{confirmation_id}",
            "get",
            "200",
            api.get(f"/api/v1/confirmations/{held['data']['confirmation_id']}").json(),
        ),
    ]

    for path, method, status, body in answers:
        validator(served, path, method, status).validate(body)


def test_the_reviewers_decisions_are_described_with_their_authentication(
    served: dict[str, Any],
) -> None:
    approve = served["paths"]["/api/v1/confirmations/{confirmation_id}/approve"]["post"]
    reject = served["paths"]["/api/v1/confirmations/{confirmation_id}/reject"]["post"]

    schemes = served["components"]["securitySchemes"]
    assert schemes["ReviewerToken"]["name"] == "Authorization"
    assert {name for item in approve["security"] for name in item} == {
        "ReviewerToken",
        "cookieAuth",
    }
    assert {"200", "401", "403", "404", "409"} <= set(approve["responses"])
    # The body is optional: {"separate": true} approves a possible duplicate as a separate one.
    separate = served["components"]["schemas"]["ApproveRequest"]["properties"]["separate"]
    assert separate["type"] == "boolean" and separate["default"] is False
    assert approve["requestBody"].get("required", False) is False
    reason = served["components"]["schemas"]["RejectRequest"]
    assert reason["required"] == ["reason"]
    assert set(reject["requestBody"]["content"]) == {"application/json"}
    assert {"200", "400", "401", "403", "404", "409"} <= set(reject["responses"])


@pytest.mark.usefixtures("orders")
def test_the_reviewers_answers_match_the_schema(
    served: dict[str, Any], api: AgentClient, live_server: LiveServer
) -> None:
    reviewer = User.objects.create_user("rita")
    reviewer.groups.add(Group.objects.create(name="reviewers"))
    token = reviewer_token_create(user=reviewer)
    first = api.refund(6000)["data"]["confirmation_id"]
    second = api.refund(6100)["data"]["confirmation_id"]

    def post(confirmation_id: str, action: str, token: str, **body: Any) -> Any:
        return requests.post(
            f"{live_server.url}/api/v1/confirmations/{confirmation_id}/{action}",
            json=body or None,
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        ).json()

    path = "/api/v1/confirmations/{confirmation_id}/"
    answers = [
        (path + "approve", "403", post(first, "approve", api.token or "")),
        (path + "approve", "404", post("nope", "approve", token)),
        (path + "approve", "200", post(first, "approve", token)),
        (path + "approve", "409", post(first, "approve", token)),
        (path + "reject", "400", post(second, "reject", token)),
        (path + "reject", "200", post(second, "reject", token, reason="duplicate")),
    ]

    for operation, status, body in answers:
        validator(served, operation, "post", status).validate(body)
    assert answers[2][2]["status"] == "executed"
    assert answers[5][2]["status"] == "rejected"

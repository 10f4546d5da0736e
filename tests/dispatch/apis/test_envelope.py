"""Errors of the envelope, not of the call: HTTP status codes, one error shape, nothing recorded
and no money moved."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from pytest_django import Settings

from dispatch.models import (
    Agent,
    AuditRecord,
    Confirmation,
    HostIdempotencyKey,
    SecurityEvent,
    Session,
)
from dispatch.services import token_hash
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}
ENVELOPE = {
    "session_id": "s-1",
    "customer_id": "CUS-1",
    "tool": "refund_order",
    "arguments": REFUND,
}


def error_of(response: requests.Response, status: int) -> dict[str, Any]:
    """The error body, once its status and its exact shape are checked."""
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"status", "code", "message", "retryable"}
    assert body["error"]["status"] == status
    assert body["error"]["message"]
    # Sending the same request again can help only once the rate allows it again.
    assert body["error"]["retryable"] is (status == 429)
    error: dict[str, Any] = body["error"]
    return error


def assert_nothing_recorded(ledger: Ledger) -> None:
    assert ledger.state() == (0, 0)
    assert AuditRecord.objects.count() == 0
    assert Session.objects.count() == 0


# 400 -----------------------------------------------------------------------------------------


def envelope_with(**changes: Any) -> str:
    return json.dumps({**ENVELOPE, **changes})


def envelope_without(name: str) -> str:
    return json.dumps({key: value for key, value in ENVELOPE.items() if key != name})


MALFORMED: list[tuple[str, bytes | str, str]] = [
    ("an empty body", b"", "The body is not strict JSON"),
    ("prose", "refund ORD-1001 please", "The body is not strict JSON"),
    ("form data", "session_id=s-1&customer_id=CUS-1", "The body is not strict JSON"),
    ("a truncated object", envelope_with()[:-1], "The body is not strict JSON"),
    ("a NaN", envelope_with(arguments="{}").replace('"{}"', "NaN"), "NaN is not JSON"),
    ("an array", json.dumps([ENVELOPE]), "must be a JSON object with session_id"),
    ("a string", '"s-1"', "must be a JSON object with session_id"),
    ("a number", "42", "must be a JSON object with session_id"),
    ("null", "null", "must be a JSON object with session_id"),
    ("no arguments", envelope_without("arguments"), "arguments: required but not sent"),
    ("no tool", envelope_without("tool"), "tool: required but not sent"),
    ("no session", envelope_without("session_id"), "session_id: required but not sent"),
    ("no customer", envelope_without("customer_id"), "customer_id: required but not sent"),
    ("an extra field", envelope_with(model="gpt-x"), "model: unknown field (the only fields are"),
    ("a session id with a space", envelope_with(session_id="s 1"), 'session_id: "s 1" does not'),
    ("a session id with a slash", envelope_with(session_id="s/1"), 'session_id: "s/1" does not'),
    ("an empty session id", envelope_with(session_id=""), 'session_id: "" does not match'),
    ("a session id with é", envelope_with(session_id="sé"), 'session_id: "s\\u00e9" does not'),
    ("a long session id", envelope_with(session_id="s" * 129), 'session_id: "sss'),
    ("a numeric session id", envelope_with(session_id=1), "session_id: 1 is a number, not a"),
    ("a customer id with a space", envelope_with(customer_id="CUS 1"), 'customer_id: "CUS 1"'),
    ("an empty tool", envelope_with(tool=""), 'tool: "" has 0 characters, fewer than 1'),
    ("a long tool", envelope_with(tool="t" * 129), "has 129 characters, more than 128"),
    ("a tool as a list", envelope_with(tool=["refund_order"]), 'tool: ["refund_order"] is an'),
    ("non-UTF-8 bytes", b'{"session_id": "s-\xff\xfe", "tool": "x"}', "The body is not UTF-8."),
    ("Latin-1 text", envelope_with(session_id="s-1").encode().replace(b"s-1", b"s-\xe9"), "UTF-8"),
]


@pytest.mark.parametrize(
    ("body", "phrase"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_a_malformed_envelope_is_a_400_and_reaches_nothing(
    api: AgentClient, ledger: Ledger, body: bytes | str, phrase: str
) -> None:
    error = error_of(api.post_body(body), 400)

    assert error["code"] == "malformed_envelope"
    assert phrase in error["message"], error["message"]
    assert_nothing_recorded(ledger)


UNSTORABLE = {
    "a NUL": ("\u0000", "a NUL character"),
    "a lone surrogate": ("\ud800", "an unpaired surrogate"),
}


@pytest.mark.parametrize("field", ["context", "session_id", "customer_id"])
@pytest.mark.parametrize("text", list(UNSTORABLE), ids=list(UNSTORABLE))
def test_it_refuses_host_text_no_database_can_store_naming_the_field(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger, field: str, text: str
) -> None:
    character, problem = UNSTORABLE[text]
    # A refund that would be held: its confirmation keeps the context.
    held = {**REFUND, "amount_cents": 6_000}
    body = envelope_with(arguments=held, **{field: f"{ENVELOPE.get(field, 'ok')}{character}"})

    response = api.post_body(body, headers={"Idempotency-Key": "key-1"})

    error = error_of(response, 400)
    assert error["code"] == "malformed_envelope"
    assert error["message"].startswith(f"{field}: a string holds {problem}"), error["message"]
    assert "which no database can store" in error["message"]
    assert_nothing_recorded(ledger)
    assert Confirmation.objects.count() == HostIdempotencyKey.objects.count() == 0
    event = SecurityEvent.objects.get()
    assert (event.status, event.reason, event.agent) == (400, "malformed_envelope", agent[0])
    assert event.detail.startswith(f"{field}: ")


def test_a_lone_surrogate_in_the_arguments_is_refused_naming_them(
    api: AgentClient, ledger: Ledger
) -> None:
    body = envelope_with(arguments={**REFUND, "reason": "damaged\ud800"})

    error = error_of(api.post_body(body), 400)

    assert error["message"].startswith("arguments: a string holds an unpaired surrogate")
    assert_nothing_recorded(ledger)
    assert SecurityEvent.objects.get().reason == "malformed_envelope"


# 415 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "shown"),
    [
        ("text/plain", "text/plain"),
        ("text/plain; charset=utf-8", "text/plain"),
        ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
        ("multipart/form-data; boundary=x", "multipart/form-data"),
        ("application/jsonx", "application/jsonx"),
        ("application/json; charset=latin-1", "application/json; charset=latin-1"),
        # Django's development server, which the live server is, calls a missing one text/plain.
        (None, "not "),
    ],
    ids=["text", "text in UTF-8", "a form", "multipart", "a lookalike", "JSON in Latin-1", "none"],
)
def test_a_well_formed_envelope_in_another_media_type_is_a_415_and_moves_no_money(
    api: AgentClient, ledger: Ledger, content_type: str | None, shown: str
) -> None:
    response = api.post_body(envelope_with(), headers={"Content-Type": content_type})  # type: ignore[dict-item]

    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type"
    assert shown in error["message"]
    assert "application/json" in error["message"]
    assert_nothing_recorded(ledger)


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_with_or_without_its_charset_is_accepted(
    api: AgentClient, ledger: Ledger, content_type: str
) -> None:
    response = api.post_body(envelope_with(), headers={"Content-Type": content_type})

    assert response.status_code == 200
    assert response.json()["ok"] is True
    assert ledger.state() == (1, 1000)


# 401 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "not_authenticated"),
        ("", "not_authenticated"),
        ("Basic {token}", "not_authenticated"),
        ("{token}", "not_authenticated"),
        ("Token", "authentication_failed"),
        ("Token {token} extra", "authentication_failed"),
        ("Token tg_not-a-real-token", "authentication_failed"),
        ("Token {token}x", "authentication_failed"),
        ("Bearer {token}x", "authentication_failed"),
    ],
    ids=[
        "no header",
        "an empty header",
        "another scheme",
        "no scheme",
        "no token",
        "two tokens",
        "an unknown token",
        "a token one character off",
        "a bearer token one character off",
    ],
)
def test_a_missing_or_bad_token_is_a_401_and_moves_no_money(
    client_for: ClientFor,
    agent: tuple[Agent, str],
    ledger: Ledger,
    authorization: str | None,
    code: str,
) -> None:
    client = client_for(None)
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(token=agent[1])

    error = error_of(client.post_body(envelope_with(), headers=headers), 401)

    assert error["code"] == code
    assert_nothing_recorded(ledger)


def test_a_token_with_non_ascii_bytes_is_a_401(
    client_for: ClientFor, ledger: Ledger, agent: tuple[Agent, str]
) -> None:
    client = client_for(None)
    response = client.http.post(
        f"{client.base_url}/api/v1/calls",
        data=envelope_with(),
        headers={"Authorization": b"Token tg_\xff\xfe", "Content-Type": "application/json"},
        timeout=30,
    )

    assert error_of(response, 401)["code"] == "authentication_failed"
    assert_nothing_recorded(ledger)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "Token"])
def test_the_token_is_taken_under_either_scheme(
    client_for: ClientFor, agent: tuple[Agent, str], ledger: Ledger, scheme: str
) -> None:
    client = client_for(None)

    response = client.post_call(
        "refund_order",
        {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"},
        headers={"Authorization": f"{scheme} {agent[1]}"},
    )

    assert response.status_code == 200, response.text
    assert response.json()["code"] == "OK"
    assert ledger.state() == (1, 1000)


def test_a_401_asks_for_a_token(client_for: ClientFor) -> None:
    response = client_for(None).post_body(envelope_with())

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Token"


def test_a_disabled_agents_token_is_a_401(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger
) -> None:
    Agent.objects.filter(pk=agent[0].pk).update(is_active=False)

    error = error_of(api.post_body(envelope_with()), 401)

    assert error["code"] == "authentication_failed"
    assert "disabled" in error["message"]
    assert_nothing_recorded(ledger)


# 409 -----------------------------------------------------------------------------------------


def test_a_session_bound_to_another_customer_is_a_409_and_counts_nothing(
    api: AgentClient, ledger: Ledger
) -> None:
    assert api.call("get_order", {"order_id": "ORD-1001"}, customer="CUS-1")["ok"]

    # A host that lost track of its sessions, or a hostile one, tries another customer's order.
    error = error_of(
        api.post_call(
            "refund_order",
            {**REFUND, "order_id": "ORD-1002", "currency": "USD"},
            customer="CUS-2",
        ),
        409,
    )

    assert error["code"] == "session_conflict"
    session = Session.objects.get()
    assert (session.customer_id, session.steps) == ("CUS-1", 1)
    assert AuditRecord.objects.count() == 1
    assert ledger.state("ORD-1002") == (0, 0)
    assert ledger.rows() == 0


def test_the_same_session_id_of_another_agent_is_another_session(
    api: AgentClient, make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    other = client_for(make_agent()[1])
    assert api.call("get_order", {"order_id": "ORD-1001"}, customer="CUS-1")["ok"]

    result = other.call("get_order", {"order_id": "ORD-1002"}, customer="CUS-2")

    assert result["ok"] is True
    assert Session.objects.count() == 2
    assert ledger.rows() == 0


# 413 -----------------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_413_and_reaches_nothing(
    api: AgentClient, ledger: Ledger, settings: Settings
) -> None:
    body = envelope_with(arguments={**REFUND, "reason": "x" * settings.TOOLGATE_MAX_BODY_BYTES})

    error = error_of(api.post_body(body), 413)

    assert error["code"] == "payload_too_large"
    assert str(settings.TOOLGATE_MAX_BODY_BYTES) in error["message"]
    assert_nothing_recorded(ledger)


def test_the_body_limit_is_read_from_the_setting(
    api: AgentClient, ledger: Ledger, settings: Settings
) -> None:
    body = envelope_with(arguments={**REFUND, "reason": "damaged", "pad": "x" * 1000})
    settings.TOOLGATE_MAX_BODY_BYTES = len(body) - 1

    error = error_of(api.post_body(body), 413)

    assert error["message"] == f"The body is {len(body)} bytes; the limit is {len(body) - 1}."
    assert_nothing_recorded(ledger)
    settings.TOOLGATE_MAX_BODY_BYTES = len(body)
    assert api.post_body(body).json()["code"] == "INVALID_ARGUMENTS"


# 429 -----------------------------------------------------------------------------------------


def test_an_agent_over_its_rate_is_a_429_and_moves_no_money(
    api: AgentClient,
    make_agent: MakeAgent,
    client_for: ClientFor,
    ledger: Ledger,
    settings: Settings,
) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "2/min"
    assert api.refund(1000)["ok"]
    assert api.get("/api/v1/codes").status_code == 200

    response = api.post_body(envelope_with(arguments={**REFUND, "amount_cents": 2000}))

    error = error_of(response, 429)
    assert error["code"] == "throttled"
    assert int(response.headers["Retry-After"]) > 0
    assert ledger.state() == (1, 1000)
    assert AuditRecord.objects.count() == 1
    # The rate is per agent: another agent is not held back by this one.
    assert client_for(make_agent()[1]).refund(2000, session="s-2")["ok"]
    assert ledger.state() == (2, 3000)


# 403 -----------------------------------------------------------------------------------------


def test_an_agent_without_a_policy_is_a_403_not_a_500(
    client_for: ClientFor, ledger: Ledger
) -> None:
    token = "tg_agent-made-without-agent-create"
    Agent.objects.create(name="bare", token_prefix=token[:10], token_hash=token_hash(token))
    api = client_for(token)

    error = error_of(api.post_body(envelope_with()), 403)

    assert error["code"] == "permission_denied"
    assert "no policy" in error["message"]
    assert api.get("/api/v1/tools").status_code == 403
    assert_nothing_recorded(ledger)


def test_a_method_the_endpoint_lacks_is_a_405_in_the_error_shape(api: AgentClient) -> None:
    error = error_of(api.get("/api/v1/calls"), 405)

    assert error["code"] == "method_not_allowed"

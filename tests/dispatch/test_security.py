"""Refused requests of the agent API leave a security event: when, which agent if known, from
which address, and why; the table stays bounded, and managers and admins can read it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
import requests
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction
from django.test import Client, RequestFactory
from django.utils import timezone
from pytest_django import Settings

from dispatch.models import Agent, CallChannel, SecurityEvent
from dispatch.security import PRUNE_EVERY, api_origin, security_event_record
from dispatch.services import token_hash
from dispatch.store.guards import SECURITY_EVENTS_MIN_ROWS
from tests.conftest import AgentClient, ClientFor, Ledger, Run

pytestmark = pytest.mark.usefixtures("orders")

ENVELOPE = {
    "session_id": "s-1",
    "customer_id": "CUS-1",
    "tool": "refund_order",
    "arguments": {
        "order_id": "ORD-1001",
        "amount_cents": 1000,
        "currency": "BRL",
        "reason": "damaged",
    },
}
BODY = json.dumps(ENVELOPE)


@dataclass
class Scene:
    api: AgentClient
    agent: Agent
    client_for: ClientFor
    settings: Settings


Provoke = Callable[[Scene], tuple[requests.Response, Agent | None]]


def no_token(scene: Scene) -> tuple[requests.Response, Agent | None]:
    return scene.client_for(None).post_body(BODY), None


def a_wrong_token(scene: Scene) -> tuple[requests.Response, Agent | None]:
    return scene.client_for("tg_guessed-token").post_body(BODY), None


def a_malformed_envelope(scene: Scene) -> tuple[requests.Response, Agent | None]:
    return scene.api.post_body('{"session_id": "s-1"'), scene.agent


def an_agent_without_a_policy(scene: Scene) -> tuple[requests.Response, Agent | None]:
    token = "tg_agent-made-without-agent-create"
    bare = Agent.objects.create(name="bare", token_prefix=token[:10], token_hash=token_hash(token))
    return scene.client_for(token).post_body(BODY), bare


def a_session_of_another_customer(scene: Scene) -> tuple[requests.Response, Agent | None]:
    assert scene.api.call("get_order", {"order_id": "ORD-1001"}, customer="CUS-1")["ok"]
    return scene.api.post_call("get_order", {"order_id": "ORD-1002"}, customer="CUS-2"), scene.agent


def a_body_over_the_limit(scene: Scene) -> tuple[requests.Response, Agent | None]:
    padding = "x" * scene.settings.TOOLGATE_MAX_BODY_BYTES
    return scene.api.post_body(json.dumps({**ENVELOPE, "pad": padding})), scene.agent


def a_text_body(scene: Scene) -> tuple[requests.Response, Agent | None]:
    return scene.api.post_body(BODY, headers={"Content-Type": "text/plain"}), scene.agent


def one_call_too_many(scene: Scene) -> tuple[requests.Response, Agent | None]:
    scene.settings.TOOLGATE_AGENT_THROTTLE_RATE = "1/min"
    assert scene.api.get("/api/v1/codes").status_code == 200
    return scene.api.post_body(BODY), scene.agent


REFUSALS: list[tuple[Provoke, int, str]] = [
    (no_token, 401, "not_authenticated"),
    (a_wrong_token, 401, "authentication_failed"),
    (a_malformed_envelope, 400, "malformed_envelope"),
    (an_agent_without_a_policy, 403, "permission_denied"),
    (a_session_of_another_customer, 409, "session_conflict"),
    (a_body_over_the_limit, 413, "payload_too_large"),
    (a_text_body, 415, "unsupported_media_type"),
    (one_call_too_many, 429, "throttled"),
]


@pytest.fixture
def scene(
    api: AgentClient, agent: tuple[Agent, str], client_for: ClientFor, settings: Settings
) -> Scene:
    return Scene(api=api, agent=agent[0], client_for=client_for, settings=settings)


@pytest.mark.parametrize(
    ("provoke", "status", "reason"),
    REFUSALS,
    ids=[provoke.__name__ for provoke, _, _ in REFUSALS],
)
def test_a_refused_request_is_recorded_as_a_security_event(
    scene: Scene, ledger: Ledger, provoke: Provoke, status: int, reason: str
) -> None:
    response, agent = provoke(scene)

    assert response.status_code == status, response.text
    event = SecurityEvent.objects.get()
    assert (event.status, event.reason, event.agent) == (status, reason, agent)
    assert (event.channel, event.method, event.path, event.client_address) == (
        CallChannel.API,
        "POST",
        "/api/v1/calls",
        "127.0.0.1",
    )
    assert event.detail == response.json()["error"]["message"][:200]
    assert timezone.now() - event.at < timedelta(minutes=1)
    assert ledger.state() == (0, 0)


def test_answers_that_are_not_refusals_leave_no_security_event(api: AgentClient) -> None:
    answers = [
        api.call("get_order", {"order_id": "ORD-1001"})["ok"],
        api.call("refund_order", "not json")["code"] == "INVALID_JSON",
        api.get("/api/v1/codes").status_code == 200,
        api.get("/api/v1/no-such-endpoint").status_code == 404,
        api.get("/api/v1/calls").status_code == 405,
    ]

    assert all(answers)
    assert SecurityEvent.objects.count() == 0


def test_behind_a_trusted_proxy_the_event_has_the_forwarded_address(
    client_for: ClientFor, settings: Settings
) -> None:
    anonymous = client_for(None)
    forwarded = {"X-Forwarded-For": "6.6.6.6, 203.0.113.7"}
    anonymous.post_body(BODY, headers=forwarded)
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 1

    anonymous.post_body(BODY, headers=forwarded)

    addresses = list(SecurityEvent.objects.order_by("pk").values_list("client_address", flat=True))
    assert addresses == ["127.0.0.1", "203.0.113.7"]


def test_long_paths_and_messages_are_clipped(client_for: ClientFor, api: AgentClient) -> None:
    long_path = "/api/v1/sessions/" + "s" * 600 + "/calls"
    client_for(None).get(long_path)
    # Every field missing, each with its description, and one unknown: a message of over 200.
    api.post_body(json.dumps({"x" * 600: 1}))

    anonymous, malformed = SecurityEvent.objects.order_by("pk")

    assert len(anonymous.path) == 200
    assert anonymous.path.startswith("/api/v1/sessions/sss")
    assert anonymous.path.endswith("…")
    assert malformed.reason == "malformed_envelope"
    assert len(malformed.detail) == 200


def test_it_records_a_refusal_whose_path_holds_a_nul_with_the_nul_escaped(
    client_for: ClientFor,
) -> None:
    response = client_for(None).get("/api/v1/sessions/s%00/calls")

    assert response.status_code == 401
    event = SecurityEvent.objects.get()
    assert (event.status, event.path) == (401, "/api/v1/sessions/s\\u0000/calls")


def test_a_refusal_that_cannot_be_recorded_is_still_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The table is gone (within this test's transaction, which puts it back).
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE dispatch_securityevent RENAME TO dispatch_securityevent_gone")

    with caplog.at_level(logging.WARNING):
        response = Client().post("/api/v1/calls", BODY, content_type="application/json")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert any("Could not record the security event" in r.getMessage() for r in caplog.records)
    # The failed write rolled back to its savepoint: the request's transaction is still usable.
    assert Agent.objects.count() == 0


# Bounded ---------------------------------------------------------------------------------------


def _record(n: int) -> list[SecurityEvent | None]:
    request = RequestFactory().post("/api/v1/calls", REMOTE_ADDR="198.51.100.1")
    return [
        security_event_record(
            origin=api_origin(request),
            agent=None,
            status=401,
            reason="authentication_failed",
            detail="",
        )
        for _ in range(n)
    ]


def _old_events(count: int) -> list[int]:
    """Events written before the test's, in bulk: the caps kept are at least the floor's rows."""
    made = SecurityEvent.objects.bulk_create(
        SecurityEvent(at=timezone.now(), method="POST", path="/", status=401, reason="x")
        for _ in range(count)
    )
    return [event.pk for event in made]


def test_writes_keep_the_table_within_its_cap(settings: Settings) -> None:
    settings.TOOLGATE_SECURITY_EVENTS_MAX_ROWS = SECURITY_EVENTS_MIN_ROWS
    oldest = _old_events(SECURITY_EVENTS_MIN_ROWS)[0]

    events = _record(2 * PRUNE_EVERY + 5)

    assert all(event is not None for event in events)
    kept = SecurityEvent.objects.count()
    assert kept < SECURITY_EVENTS_MIN_ROWS + PRUNE_EVERY
    newest = events[-1]
    assert newest is not None
    assert SecurityEvent.objects.filter(pk=newest.pk).exists()
    assert not SecurityEvent.objects.filter(pk=oldest).exists()


def test_the_prune_command_deletes_events_past_their_retention(
    run: Run, settings: Settings
) -> None:
    settings.TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS = 30
    now = timezone.now()
    for days in (31, 45, 400):
        SecurityEvent.objects.create(
            at=now - timedelta(days=days), method="POST", path="/", status=401, reason="x"
        )
    recent = _record(2)

    output = run("prune_security_events")

    assert "Deleted 3 security event(s); 2 kept" in output
    assert sorted(SecurityEvent.objects.values_list("pk", flat=True)) == sorted(
        e.pk for e in recent if e
    )


def test_the_prune_command_applies_a_lowered_cap(run: Run, settings: Settings) -> None:
    events = _old_events(SECURITY_EVENTS_MIN_ROWS + 30)
    settings.TOOLGATE_SECURITY_EVENTS_MAX_ROWS = SECURITY_EVENTS_MIN_ROWS

    run("prune_security_events")

    kept = sorted(SecurityEvent.objects.values_list("pk", flat=True))
    assert kept == events[30:]


@pytest.mark.parametrize(
    ("days", "rows"), [(0, SECURITY_EVENTS_MIN_ROWS), (30, SECURITY_EVENTS_MIN_ROWS - 1)]
)
def test_settings_below_the_floors_prune_nothing_and_say_so(
    run: Run, settings: Settings, days: int, rows: int
) -> None:
    events = _old_events(SECURITY_EVENTS_MIN_ROWS + 5)
    settings.TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS = days
    settings.TOOLGATE_SECURITY_EVENTS_MAX_ROWS = rows

    with pytest.raises(ImproperlyConfigured, match="kept at least"):
        run("prune_security_events")

    assert SecurityEvent.objects.count() == len(events)


def test_a_security_event_is_never_updated_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the append-only trigger is PostgreSQL's")
    (event,) = _record(1)
    assert event is not None

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        SecurityEvent.objects.filter(pk=event.pk).update(reason="nothing to see")

    event.refresh_from_db()
    assert event.reason == "authentication_failed"


# Who sees them ---------------------------------------------------------------------------------


def test_security_events_are_listed_and_filtered_read_only_in_the_admin(
    admin_client: Client, agent: tuple[Agent, str]
) -> None:
    now = timezone.now()
    stuffing = SecurityEvent.objects.create(
        at=now,
        client_address="203.0.113.7",
        method="POST",
        path="/api/v1/calls",
        status=401,
        reason="authentication_failed",
    )
    switching = SecurityEvent.objects.create(
        at=now,
        agent=agent[0],
        client_address="198.51.100.1",
        method="POST",
        path="/api/v1/calls",
        status=409,
        reason="session_conflict",
    )

    by_status = admin_client.get("/admin/dispatch/securityevent/", {"status": 401})
    by_reason = admin_client.get("/admin/dispatch/securityevent/", {"reason": "session_conflict"})
    by_agent = admin_client.get("/admin/dispatch/securityevent/", {"agent__id__exact": agent[0].pk})
    by_address = admin_client.get("/admin/dispatch/securityevent/", {"q": "203.0.113.7"})
    page = admin_client.get(f"/admin/dispatch/securityevent/{stuffing.pk}/change/")
    change = admin_client.post(
        f"/admin/dispatch/securityevent/{stuffing.pk}/change/", {"reason": "fine"}
    )
    delete = admin_client.post(f"/admin/dispatch/securityevent/{stuffing.pk}/delete/")

    assert b"203.0.113.7" in by_status.content and b"198.51.100.1" not in by_status.content
    assert b"198.51.100.1" in by_reason.content and b"203.0.113.7" not in by_reason.content
    assert b"198.51.100.1" in by_agent.content and b"203.0.113.7" not in by_agent.content
    assert b"203.0.113.7" in by_address.content and b"198.51.100.1" not in by_address.content
    assert page.status_code == 200
    assert b'name="reason"' not in page.content
    assert admin_client.get("/admin/dispatch/securityevent/add/").status_code == 403
    assert (change.status_code, delete.status_code) == (403, 403)
    stuffing.refresh_from_db()
    assert stuffing.reason == "authentication_failed"
    assert SecurityEvent.objects.filter(pk=switching.pk).exists()


def test_the_admin_shows_and_filters_each_events_channel(admin_client: Client) -> None:
    for channel, address in ((CallChannel.API, "203.0.113.7"), (CallChannel.MCP, "198.51.100.1")):
        SecurityEvent.objects.create(
            at=timezone.now(),
            channel=channel,
            client_address=address,
            method="POST",
            path="/mcp" if channel == CallChannel.MCP else "/api/v1/calls",
            status=401,
            reason="authentication_failed",
        )

    listed = admin_client.get("/admin/dispatch/securityevent/")
    over_mcp = admin_client.get("/admin/dispatch/securityevent/", {"channel__exact": "mcp"})

    assert b"Channel" in listed.content and b">MCP<" in listed.content
    assert b"198.51.100.1" in over_mcp.content and b"203.0.113.7" not in over_mcp.content


def test_managers_see_security_events_and_reviewers_do_not(run: Run, client: Client) -> None:
    run("seed_demo", "--force")

    assert client.login(username="manager", password="toolgate-demo")
    manager = client.get("/records/security/")
    manager_admin = client.get("/admin/dispatch/securityevent/")
    assert client.login(username="reviewer", password="toolgate-demo")
    reviewer = client.get("/records/security/")

    assert (manager.status_code, reviewer.status_code) == (200, 403)
    # Neither is staff: the records' page is theirs, the admin the administrator's.
    assert manager_admin.status_code == 302
    assert not User.objects.get(username="manager").is_superuser

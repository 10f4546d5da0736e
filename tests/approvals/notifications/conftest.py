"""The notification channels' stand-ins: a real SMTP server (aiosmtpd) that the tests read the
e-mail back from, and a local HTTP server that speaks the Slack Web API methods Toolgate calls
(chat.postMessage, chat.update, chat.postEphemeral), with the requests Slack itself would send,
signed as Slack signs them."""

from __future__ import annotations

import email
import hashlib
import hmac
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from django.contrib.auth.models import Group, User
from django.test import Client
from pytest_django.fixtures import Settings

SIGNING_SECRET = "slack-signing-secret-for-the-tests"
TEAM_ID = "T0TOOLGATE"
CHANNEL_ID = "C0HELDCALLS"
BOT_TOKEN = "xoxb-test-bot-token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ReceivedMail:
    sender: str
    recipients: list[str]
    message: Message
    at: float

    def text(self) -> str:
        for part in self.message.walk():
            if part.get_content_type() == "text/plain":
                payload = part.get_payload(decode=True)
                assert isinstance(payload, bytes)
                return payload.decode()
        return ""

    def html(self) -> str:
        for part in self.message.walk():
            if part.get_content_type() == "text/html":
                payload = part.get_payload(decode=True)
                assert isinstance(payload, bytes)
                return payload.decode()
        return ""


@dataclass
class SmtpServer:
    host: str
    port: int
    received: list[ReceivedMail] = field(default_factory=list)
    # Answer the next n messages with a temporary failure.
    refuse: int = 0

    def wait_for(self, count: int, timeout: float = 20.0) -> list[ReceivedMail]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.received)


class _Handler:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, smtp: SMTP, session: Session, envelope: Envelope) -> str:
        if self.server.refuse:
            self.server.refuse -= 1
            return "451 Try again later"
        content = envelope.original_content or b""
        self.server.received.append(
            ReceivedMail(
                sender=str(envelope.mail_from),
                recipients=list(envelope.rcpt_tos),
                message=email.message_from_bytes(content),
                at=time.monotonic(),
            )
        )
        return "250 OK"


@contextmanager
def smtp_stand_in() -> Iterator[SmtpServer]:
    """A real SMTP server on 127.0.0.1 that keeps what it receives (bench/notify.py uses it too)."""
    server = SmtpServer(host="127.0.0.1", port=free_port())
    controller = Controller(_Handler(server), hostname=server.host, port=server.port)
    controller.start()
    try:
        yield server
    finally:
        controller.stop()


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    with smtp_stand_in() as server:
        yield server


@dataclass
class SlackCall:
    method: str
    arguments: dict[str, Any]
    authorization: str
    at: float


@dataclass
class SlackApi:
    """What Toolgate asked of Slack's Web API, in order; `fail` answers the next n calls with
    an error (a 500, as an outage would)."""

    url: str
    calls: list[SlackCall] = field(default_factory=list)
    fail: int = 0
    _ts: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def of(self, method: str) -> list[SlackCall]:
        return [call for call in self.calls if call.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 20.0) -> list[SlackCall]:
        deadline = time.monotonic() + timeout
        while len(self.of(method)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.of(method)


@pytest.fixture
def slack_api() -> Iterator[SlackApi]:
    with slack_stand_in() as api:
        yield api


@contextmanager
def slack_stand_in() -> Iterator[SlackApi]:
    """Slack's Web API methods Toolgate calls, on 127.0.0.1 (bench/notify.py uses it too)."""
    api = SlackApi(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "json" in (self.headers.get("Content-Type") or ""):
                arguments = json.loads(body or b"{}")
            else:
                arguments = dict(parse_qsl(body.decode()))
            method = self.path.rsplit("/", 1)[-1]
            api.calls.append(
                SlackCall(
                    method, arguments, self.headers.get("Authorization", ""), time.monotonic()
                )
            )
            if api.fail:
                api.fail -= 1
                self._answer(500, {"ok": False, "error": "internal_error"})
                return
            if self.headers.get("Authorization") != f"Bearer {BOT_TOKEN}":
                self._answer(200, {"ok": False, "error": "invalid_auth"})
                return
            channel = arguments.get("channel", "")
            ts = arguments.get("ts") or f"1700000000.{next(api._ts):06d}"
            self._answer(200, {"ok": True, "channel": channel, "ts": ts})

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}/api/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def channels(settings: Settings, smtp_server: SmtpServer, slack_api: SlackApi) -> None:
    """Both channels on, pointed at the stand-ins."""
    settings.TOOLGATE_NOTIFY_EMAIL = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = smtp_server.host
    settings.EMAIL_PORT = smtp_server.port
    settings.EMAIL_TIMEOUT = 5
    settings.DEFAULT_FROM_EMAIL = "toolgate@example.test"
    settings.SLACK_BOT_TOKEN = BOT_TOKEN
    settings.SLACK_SIGNING_SECRET = SIGNING_SECRET
    settings.TOOLGATE_SLACK_TEAM_ID = TEAM_ID
    settings.TOOLGATE_SLACK_CHANNEL = CHANNEL_ID
    settings.TOOLGATE_SLACK_API_URL = slack_api.url
    settings.TOOLGATE_SITE_URL = "https://toolgate.example.test"


def reviewer(name: str, *, email: bool = True, group: str = "reviewers") -> User:
    """A user in the group (the reviewers by default), with an e-mail address unless told."""
    user = User.objects.create_user(
        name, password="pw", email=f"{name}@example.test" if email else ""
    )
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def slack_signed(
    body: str, *, secret: str = SIGNING_SECRET, at: int | None = None
) -> dict[str, str]:
    """The headers Slack sends with a body: its timestamp and v0 signature."""
    timestamp = str(int(time.time()) if at is None else at)
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256)
    return {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": f"v0={digest.hexdigest()}",
    }


def button_body(
    confirmation_id: str,
    *,
    slack_user_id: str,
    team_id: str = TEAM_ID,
    action_id: str = "toolgate_approve",
) -> str:
    """An interactive payload as Slack posts it when a button is pressed."""
    payload = {
        "type": "block_actions",
        "team": {"id": team_id, "domain": "toolgate-test"},
        "user": {"id": slack_user_id, "username": "someone", "team_id": team_id},
        "api_app_id": "A0TOOLGATE",
        "channel": {"id": CHANNEL_ID, "name": "held-calls"},
        "container": {"type": "message", "message_ts": "1700000000.000001"},
        "trigger_id": "1.2.3",
        "response_url": "https://hooks.slack.com/actions/T0/1/abc",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": f"toolgate:{confirmation_id}",
                "value": confirmation_id,
                "action_ts": str(time.time()),
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)})


def command_body(text: str, *, slack_user_id: str, team_id: str = TEAM_ID) -> str:
    return urlencode(
        {
            "token": "deprecated-verification-token",
            "team_id": team_id,
            "channel_id": CHANNEL_ID,
            "user_id": slack_user_id,
            "user_name": "someone",
            "command": "/toolgate",
            "text": text,
            "response_url": "https://hooks.slack.com/commands/T0/1/abc",
            "trigger_id": "1.2.3",
        }
    )


FORM = "application/x-www-form-urlencoded"


def slack_post(client: Client, path: str, body: str, headers: dict[str, str]) -> Any:
    return client.post(path, data=body, content_type=FORM, headers=headers)


def slack_link(client: Client, reviewer: User, slack_user_id: str) -> None:
    """Link a Slack user to the reviewer as a person does: a code on the page, sent back from
    Slack with the slash command."""
    client.force_login(reviewer)
    page = client.post("/approvals/slack/link")
    assert page.status_code == 200
    code = page.context["code"]
    body = command_body(f"link {code}", slack_user_id=slack_user_id)
    answer = slack_post(Client(), "/approvals/slack/commands", body, slack_signed(body))
    assert answer.status_code == 200
    assert "Linked" in answer.json()["text"], answer.json()

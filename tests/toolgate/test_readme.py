"""The README is true: its walk-through, sent to a freshly seeded demo, gets the answers it shows
(ids and times aside), and so does its continuation in docs/demo.md; its links and those of the
docs lead to files that exist; and it fits on a screen or two.

The walk-through's blocks are marked in the markdown: `<!-- walk-through: setup -->` before the
block that sets the token and the URL, `<!-- walk-through: request -->` before each block of
calls, `<!-- walk-through: answer -->` before the answer to the last call above it."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client

from demo.history import SESSIONS
from tests.conftest import Run

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The walk-through goes on there, on the same demo, after the README's calls.
WALK_THROUGH = (README, ROOT / "docs" / "demo.md")
MAX_README_LINES = 250

_MARKED = re.compile(r"^<!-- walk-through: (\w+) -->\n```\w+\n(.*?)^```", re.S | re.M)
_SETUP_TOKEN = re.compile(r"^TOKEN=(\S+)$", re.M)
_SETUP_URL = re.compile(r'curl -s (\S+) -H "Authorization: Token \$TOKEN"')
# What differs from one seeded demo to the next: call and confirmation ids, times, refund ids.
_MASKS = (
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00\b"), "<time>"),
    (re.compile(r"\bRF-\d+\b"), "RF-<n>"),
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Step:
    """The calls of one request block, and the answer shown for its last one."""

    where: str
    bodies: list[str]
    answer: dict[str, Any]


def setup(text: str) -> tuple[str, str]:
    """The token and the API path the walk-through's `call` sends to."""
    [block] = [body for kind, body in _MARKED.findall(text) if kind == "setup"]
    token, url = _SETUP_TOKEN.search(block), _SETUP_URL.search(block)
    assert token is not None and url is not None, block
    return token.group(1), urlsplit(url.group(1)).path


def steps(path: Path) -> list[Step]:
    found: list[Step] = []
    bodies: list[str] | None = None
    for kind, block in _MARKED.findall(path.read_text()):
        if kind == "request":
            words = shlex.split(block)
            assert words[::2] == ["call"] * (len(words) // 2), block
            bodies = words[1::2]
        elif kind == "answer":
            assert bodies, f"{path.name}: an answer with no request before it"
            found.append(Step(f"{path.name}: {bodies[-1][:90]}", bodies, json.loads(block)))
            bodies = None
    return found


def masked(value: Any) -> Any:
    if isinstance(value, str):
        for pattern, mask in _MASKS:
            value = pattern.sub(mask, value)
        return value
    if isinstance(value, dict):
        return {key: masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [masked(item) for item in value]
    return value


# Committed for real, as `make demo` seeds: each approval's execution runs once it commits.
@pytest.mark.django_db(transaction=True)
def test_the_walk_through_gets_the_answers_it_shows_from_a_freshly_seeded_demo(
    run: Run, client: Client
) -> None:
    token, path = setup(README.read_text())
    walk = [step for document in WALK_THROUGH for step in steps(document)]
    run("seed_demo", "--force", "--history-sessions", str(SESSIONS))

    wrong = []
    for step in walk:
        for body in step.bodies:
            response = client.post(
                path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
            )
            assert response.status_code == 200, (step.where, response.content)
        got = response.json()
        if masked(got) != masked(step.answer):
            wrong.append(f"{step.where}\n  shows {step.answer}\n  got   {got}")

    assert len(walk) >= 5
    assert wrong == []


def test_every_answer_and_call_the_readme_shows_is_checked() -> None:
    text = README.read_text()
    marked = _MARKED.findall(text)

    answers = [block for kind, block in marked if kind == "answer"]
    requests = [block for kind, block in marked if kind == "request"]
    assert len(answers) == len(re.findall(r"^```json$", text, re.M)) >= 3
    assert sum(block.count("call '") for block in requests) == text.count("call '")


def test_masking_keeps_what_the_answer_says() -> None:
    shown = {"code": "OK", "message": "held as 0123456789abcdef0123456789abcdef until "}
    said = dict(shown, code="CONFIRMATION_REQUIRED")

    assert masked(shown) != masked(said)
    assert masked({"refund_id": "RF-4"}) == masked({"refund_id": "RF-402"})
    assert masked({"at": "2026-12-07T02:35:57.317623+00:00"}) == {"at": "<time>"}


def test_the_readme_fits_on_a_screen_or_two() -> None:
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize(
    "document",
    [README, *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_every_link_leads_to_a_file_that_exists(document: Path) -> None:
    targets = [link.split("#")[0] for link in _LINK.findall(document.read_text())]
    local = [target for target in targets if target and "://" not in target]

    missing = [target for target in local if not (document.parent / target).exists()]

    assert missing == []

"""A held call of a second domain (tests.approvals.goodwill) goes through the reviewer's pages,
the API and MCP as a refund does, described by its own declaration alone."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.services import confirmation_reject
from dispatch.mcp import server_instructions
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.selectors import confirmation_state
from dispatch.services import call_dispatch
from tests.approvals.goodwill import (
    GOODWILL_TOOLS,
    GoodwillDesk,
    goodwill_registered,
    opened_desk,
)
from tests.approvals.test_pages import text
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).parents[2]
VOUCHER = {"account_id": "ACC-7", "amount_cents": 8_000, "currency": "BRL", "occasion": "apology"}
GIFT = {"account_id": "ACC-7", "gift": "tote_bag"}
# What the installed domains' high-risk tools call their actions, before the desk's own: the
# refunds of orders, and the cancellations, order changes and the rest of retail.
HELD = "refunds, cancellations, order changes, returns, exchanges, address changes"


@pytest.fixture
def desk() -> Iterator[GoodwillDesk]:
    with goodwill_registered(opened_desk()) as desk:
        yield desk


@pytest.fixture
def goodwill_agent(make_agent: MakeAgent, desk: GoodwillDesk) -> Agent:
    # From 50.00 a human decides, as for the refunds of the other tests.
    tools = ["get_order", "refund_order", *GOODWILL_TOOLS]
    return make_agent(allowed_tools=tools, auto_approve_below_cents=5_000)[0]


def hold(agent: Agent, tool: str, arguments: dict[str, Any]) -> Confirmation:
    result = call_dispatch(
        agent=agent, session_id="s-1", customer_id="CUS-1", tool=tool, arguments=arguments
    )
    assert result.code == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result.data["confirmation_id"])


def test_a_held_voucher_shows_its_account_its_facts_and_its_words_in_the_queue(
    client: Client, reviewer: User, goodwill_agent: Agent
) -> None:
    hold(goodwill_agent, "issue_voucher", VOUCHER)
    client.force_login(reviewer)

    page = text(client.get("/approvals/"))

    assert f"{HELD.capitalize()}, vouchers and gifts that agents proposed" in page
    assert "R$ 80,00 Issue voucher · ACC-7" in page
    assert "Loyalty tier gold" in page
    assert "Vouchers this year R$ 30,00" in page
    assert "Occasion apology" in page
    assert "R$ 80,00 is not below R$ 50,00, the most this agent may issue without a human" in page


@pytest.mark.django_db(transaction=True)
def test_a_voucher_approved_through_the_page_is_issued_by_its_handler(
    client: Client, reviewer: User, goodwill_agent: Agent, desk: GoodwillDesk
) -> None:
    held = hold(goodwill_agent, "issue_voucher", VOUCHER)
    client.force_login(reviewer)

    response = client.post(f"/approvals/{held.pk}/approve", {"next": "/approvals/"}, follow=True)

    assert "Executed: Issue voucher R$ 80,00 ACC-7." in text(response)
    assert f"No {HELD}, vouchers and gifts are waiting" in text(response)
    [voucher] = desk.vouchers.values()
    assert (voucher.account_id, voucher.amount_cents, voucher.approved_by) == (
        "ACC-7",
        8_000,
        ("rita",),
    )
    assert desk.accounts["ACC-7"].issued_cents == 11_000
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.EXECUTED
    assert held.result is not None and held.result["data"]["voucher_id"] == voucher.voucher_id


@pytest.mark.django_db(transaction=True)
def test_a_gift_that_moves_no_amount_is_held_named_by_its_action_and_sent_once_approved(
    client: Client, reviewer: User, goodwill_agent: Agent, desk: GoodwillDesk
) -> None:
    held = hold(goodwill_agent, "send_gift", GIFT)
    client.force_login(reviewer)
    queue = text(client.get("/approvals/"))

    response = client.post(f"/approvals/{held.pk}/approve", follow=True)

    assert "Send gift ACC-7" in queue
    assert "so a human decides every gift" in queue
    assert "Gift tote bag" in queue and "Vouchers this year R$ 30,00" in queue
    assert "Executed: Send gift ACC-7." in text(response)
    assert [(gift.account_id, gift.gift) for gift in desk.gifts.values()] == [("ACC-7", "tote_bag")]


def test_an_account_gone_since_the_hold_is_said_in_the_tools_words(
    client: Client, reviewer: User, goodwill_agent: Agent, desk: GoodwillDesk
) -> None:
    held = hold(goodwill_agent, "issue_voucher", VOUCHER)
    del desk.accounts["ACC-7"]
    client.force_login(reviewer)

    page = text(client.get(f"/approvals/{held.pk}/"))

    assert "Account no longer found for this customer" in page
    assert "Loyalty tier" not in page


def test_the_history_names_the_action_and_what_it_was_for(
    client: Client, reviewer: User, goodwill_agent: Agent
) -> None:
    held = hold(goodwill_agent, "issue_voucher", VOUCHER)
    confirmation_reject(confirmation_id=held.pk, reviewer=reviewer, reason="Not this time")
    client.force_login(reviewer)

    page = text(client.get("/approvals/history/"))

    assert "R$ 80,00 Issue voucher · ACC-7" in page
    assert "Not this time" in page


def test_the_api_and_the_webhooks_sum_up_a_held_call_in_its_tools_words(
    goodwill_agent: Agent,
) -> None:
    voucher = hold(goodwill_agent, "issue_voucher", VOUCHER)
    gift = hold(goodwill_agent, "send_gift", GIFT)

    summaries = [confirmation_state(held)["summary"] for held in (voucher, gift)]

    assert summaries == ["Issue voucher: 8000 BRL for ACC-7", "Send gift: ACC-7"]


def test_mcp_tells_its_clients_what_may_be_held_in_the_tools_words(desk: GoodwillDesk) -> None:
    instructions = server_instructions()

    assert f"{HELD}, vouchers and gifts may be held for a human (CONFIRMATION_REQUIRED)" in (
        instructions
    )


# Where no domain is named: the reviewer's code and pages, and dispatch's, outside comments and
# docstrings. The policy's help texts and the agent command's example are their owners' words.
# SQL's ORDER BY, "in order" and "the order they came in" are no domain's.
DOMAIN_WORDS = re.compile(r"(?i:refund)|(?<!in )\b[Oo]rder(s|ed)?\b(?! (they|it|of|to)\b)")
NOT_SCANNED = {"dispatch/models.py", "dispatch/management"}


def _spoken_strings(path: Path) -> Iterator[tuple[int, str]]:
    """The string literals of a module that are not docstrings, with their line."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    statement_starts = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for index, token in enumerate(tokens):
        if token.type not in strings:
            continue
        before = next(
            (t for t in reversed(tokens[:index]) if t.type not in (tokenize.NL, tokenize.COMMENT)),
            None,
        )
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        docstring = (before is None or before.type in statement_starts) and (
            after is not None and after.type == tokenize.NEWLINE
        )
        if not docstring:
            yield token.start[0], token.string


def test_approvals_and_dispatch_name_no_domain_outside_comments() -> None:
    modules = [
        path
        for folder in ("approvals", "dispatch")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "migrations" not in path.parts
        and not any(str(path.relative_to(ROOT)).startswith(skip) for skip in NOT_SCANNED)
    ]
    templates = sorted((ROOT / "templates" / "approvals").glob("*.html"))

    named = [
        f"{path.relative_to(ROOT)}:{line}: {string}"
        for path in modules
        for line, string in _spoken_strings(path)
        if DOMAIN_WORDS.search(string)
    ] + [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in templates
        for match in DOMAIN_WORDS.finditer(re.sub(r"{#.*?#}", "", path.read_text(), flags=re.S))
    ]

    assert named == []

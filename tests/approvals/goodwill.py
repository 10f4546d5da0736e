"""A second domain, for the tests only: a goodwill desk that issues vouchers to a customer's
loyalty account and sends them gifts.

It is declared as `orders` declares its tools (arguments, check, handler, flags, what a reviewer
sees and the words for it) on a state of its own, in memory, and registered on the live registry
for as long as a test needs it. Nothing outside this module knows it: the queue, the decision
pages, the history, the API, the webhooks and MCP show its held calls from the declaration alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    MoneyFromArguments,
    Refused,
    Rejection,
    Risk,
    ToolSpec,
)
from dispatch.registry import tool_registry

ACCOUNT_NOT_FOUND = Code(
    "ACCOUNT_NOT_FOUND",
    5,
    "No loyalty account with that id exists for this customer.",
    True,
    False,
)
ACCOUNT_PATTERN = r"^ACC-[0-9]{1,8}$"


class Account(NamedTuple):
    account_id: str
    customer_id: str
    tier: str
    currency: str
    # What vouchers gave this account this year, in minor units of its currency.
    issued_cents: int


class Voucher(NamedTuple):
    voucher_id: str
    account_id: str
    amount_cents: int
    currency: str
    approved_by: tuple[str, ...]


class Gift(NamedTuple):
    account_id: str
    gift: str
    approved_by: tuple[str, ...]


@dataclass
class GoodwillDesk:
    """The desk's system of record: accounts, and what was issued and sent, each once per key."""

    accounts: dict[str, Account] = field(default_factory=dict)
    vouchers: dict[str, Voucher] = field(default_factory=dict)
    gifts: dict[str, Gift] = field(default_factory=dict)
    # The live server answers in threads of its own.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, *, customer_id: str, account_id: str) -> Account | None:
        account = self.accounts.get(account_id)
        return account if account is not None and account.customer_id == customer_id else None

    def issue(
        self, *, account: Account, amount_cents: int, key: str, by: tuple[str, ...]
    ) -> Voucher:
        with self.lock:
            if key not in self.vouchers:
                voucher_id = f"VCH-{len(self.vouchers) + 1}"
                self.vouchers[key] = Voucher(
                    voucher_id, account.account_id, amount_cents, account.currency, by
                )
                issued = account.issued_cents + amount_cents
                self.accounts[account.account_id] = account._replace(issued_cents=issued)
            return self.vouchers[key]

    def send(self, *, account: Account, gift: str, key: str, by: tuple[str, ...]) -> Gift:
        with self.lock:
            return self.gifts.setdefault(key, Gift(account.account_id, gift, by))


def opened_desk() -> GoodwillDesk:
    """ACC-7 of CUS-1, a gold account in BRL that had R$ 30,00 of vouchers this year."""
    return GoodwillDesk(accounts={"ACC-7": Account("ACC-7", "CUS-1", "gold", "BRL", 3_000)})


class IssueVoucherArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="issue_voucher")

    account_id: str = Field(pattern=ACCOUNT_PATTERN, description="the loyalty account's id")
    amount_cents: int = Field(ge=1, le=1_000_000, description="in minor units: 25.90 is 2590")
    currency: Literal["BRL", "USD", "EUR"] = Field(description="the account's own currency")
    occasion: Literal["late_delivery", "apology"] = Field(description="why it is given")


class SendGiftArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="send_gift")

    account_id: str = Field(pattern=ACCOUNT_PATTERN, description="the loyalty account's id")
    gift: Literal["mug", "tote_bag"] = Field(description="what is sent")


def _not_found(account_id: str) -> Rejection:
    return Rejection(ACCOUNT_NOT_FOUND, f"account_id: no account {account_id} for this customer")


def goodwill_tools(desk: GoodwillDesk) -> tuple[ToolSpec[Any], ...]:
    def check_voucher(arguments: IssueVoucherArguments, context: CheckContext) -> Rejection | None:
        account = desk.find(customer_id=context.customer_id, account_id=arguments.account_id)
        return _not_found(arguments.account_id) if account is None else None

    def issue_voucher(
        arguments: IssueVoucherArguments, context: ExecutionContext
    ) -> Mapping[str, Any]:
        account = desk.find(customer_id=context.customer_id, account_id=arguments.account_id)
        if account is None:
            raise Refused(_not_found(arguments.account_id))
        voucher = desk.issue(
            account=account,
            amount_cents=arguments.amount_cents,
            key=context.idempotency_key,
            by=context.approved_by,
        )
        return {"voucher_id": voucher.voucher_id, "amount_cents": voucher.amount_cents}

    def check_gift(arguments: SendGiftArguments, context: CheckContext) -> Rejection | None:
        account = desk.find(customer_id=context.customer_id, account_id=arguments.account_id)
        return _not_found(arguments.account_id) if account is None else None

    def send_gift(arguments: SendGiftArguments, context: ExecutionContext) -> Mapping[str, Any]:
        account = desk.find(customer_id=context.customer_id, account_id=arguments.account_id)
        if account is None:
            raise Refused(_not_found(arguments.account_id))
        gift = desk.send(
            account=account,
            gift=arguments.gift,
            key=context.idempotency_key,
            by=context.approved_by,
        )
        return {"account_id": gift.account_id, "gift": gift.gift}

    def account_review(
        arguments: IssueVoucherArguments | SendGiftArguments, customer_id: str
    ) -> ReviewView:
        account = desk.find(customer_id=customer_id, account_id=arguments.account_id)
        if account is None:
            return ReviewView("Account", arguments.account_id, found=False)
        return ReviewView(
            "Account",
            account.account_id,
            facts=(
                Fact("Loyalty tier", account.tier),
                Fact("Vouchers this year", account.issued_cents, FactKind.MONEY),
            ),
            # A gift names no currency: its money fact is in the account's.
            currency=account.currency,
        )

    return (
        ToolSpec(
            name="issue_voucher",
            label="Issue voucher",
            description="Issue a voucher to the customer's loyalty account. Moves money.",
            arguments=IssueVoucherArguments,
            check=check_voucher,
            handler=issue_voucher,
            writes=True,
            risk=Risk.HIGH,
            subject_field="account_id",
            money=MoneyFromArguments(amount="amount_cents", currency="currency"),
            codes=(ACCOUNT_NOT_FOUND,),
            review=account_review,
            words=ToolWords(noun="voucher", plural="vouchers", verb="issue", past="issued"),
        ),
        ToolSpec(
            name="send_gift",
            label="Send gift",
            description="Send a gift to the customer's address on their loyalty account.",
            arguments=SendGiftArguments,
            check=check_gift,
            handler=send_gift,
            writes=True,
            # No amount is declared: the pipeline holds every call of it for a human.
            risk=Risk.HIGH,
            subject_field="account_id",
            codes=(ACCOUNT_NOT_FOUND,),
            review=account_review,
            words=ToolWords(noun="gift", plural="gifts", verb="send", past="sent"),
        ),
    )


GOODWILL_TOOLS = ("issue_voucher", "send_gift")


@contextmanager
def goodwill_registered(desk: GoodwillDesk) -> Iterator[GoodwillDesk]:
    """The desk's tools on the live registry, registered as a domain app registers its own, and
    withdrawn after: the registry offers no way to withdraw a tool, since no app ever does."""
    catalogue = tool_registry.catalogue
    specs = goodwill_tools(desk)
    for spec in specs:
        tool_registry.register(spec)
    try:
        yield desk
    finally:
        for spec in specs:
            del tool_registry._tools[spec.name]
        tool_registry._catalogue = catalogue

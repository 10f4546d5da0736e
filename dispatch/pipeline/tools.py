"""Tool declarations and the one registry through which domains offer them.

A tool is declared once: its argument model (strict pydantic), its business check (no side
effects), its handler (the effect), its flags, and what a reviewer sees of a held call (its
review and its words). Everything else — validation, JSON Schema, the vendor formats, the labels
of the dashboard, the reviewer's card — is derived from the declaration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel

from dispatch.pipeline.codes import CORE_CODES, Code, CodeCatalogue
from dispatch.pipeline.review import ReviewView, ToolWords
from dispatch.pipeline.state import Lookup, ReadAhead

Args = TypeVar("Args", bound=BaseModel)


class Risk(enum.StrEnum):
    LOW = "low"
    HIGH = "high"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One raw call as a model produced it, with what the agent host vouches for."""

    agent_id: str
    session_id: str
    customer_id: str
    tool: str
    # The model's raw text, or an object the host already parsed.
    arguments: str | Mapping[str, Any]
    # What the host sends along for a reviewer (the customer's words, the agent's summary):
    # kept with a held call, shown escaped, never interpreted.
    context: str = ""


class CheckContext(NamedTuple):
    customer_id: str
    # The tool's lookup, if the store read it as the call opened: the check's first read.
    read_ahead: ReadAhead | None = None


class ExecutionContext(NamedTuple):
    customer_id: str
    # The same for every attempt of one call: handlers pass it to the system of record.
    idempotency_key: str
    approved_by: tuple[str, ...] = ()
    # The tool's lookup as read when the call opened, for a tool with no check: the handler's
    # first read. A tool with a check gets it there, and its handler reads the live record.
    read_ahead: ReadAhead | None = None
    # The agent the call is made for: what a tool that reads the agent's own records scopes by.
    agent_id: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A business rule that the call breaks, as the domain words it."""

    code: Code
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


class Refused(Exception):
    """Raised by a handler when the system of record refuses the effect and nothing happened."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class TransientError(Exception):
    """Raised by a handler when the effect certainly did not happen and a retry may succeed."""


class OutcomeUnknownError(Exception):
    """Raised by a handler when the effect may or may not have happened (e.g. a lost response).

    Retrying is safe only because write handlers pass the idempotency key to the system of record.
    """


class EditRule(enum.StrEnum):
    """How a reviewer may change an argument of a held call before approving it."""

    # An amount (an integer) may only fall, never below its schema's own bounds.
    ONLY_LOWER = "only_lower"
    # A list may only lose entries: each one left was in it, as often at most.
    ONLY_FEWER = "only_fewer"

    @property
    def words(self) -> str:
        return {"only_lower": "may only fall", "only_fewer": "may only shrink"}[self.value]


class Editable(NamedTuple):
    """An argument a reviewer may change before approving, and its rule."""

    argument: str
    rule: EditRule


class Money(NamedTuple):
    """The money a call moves: how much (minor units), in what currency, and what it is for."""

    amount_cents: int
    currency: str
    subject: str = ""


Check = Callable[[Args, CheckContext], Rejection | None]
MoneyOf = Callable[[Args, CheckContext], Money | None]


@dataclass(frozen=True, slots=True)
class MoneyFromArguments:
    """A call's money as its arguments name it (a refund's amount and currency), what it is for
    being the tool's subject. Known before anything is read: a store may read the customer's sum
    with the call's opening."""

    # The argument that holds the amount (minor units), and the one that names its currency.
    amount: str
    currency: str


@dataclass(frozen=True, slots=True)
class MoneyFromState(Generic[Args]):
    """A call's money as its subject's state says (a cancellation refunds what the order was
    paid): known only once the check has read that state; None where the call moves none."""

    of: MoneyOf[Args]


Handler = Callable[[Args, ExecutionContext], Mapping[str, Any]]
# The record a call reads first, from its arguments and its customer's id.
LookupOf = Callable[[Args, str], Lookup]
# What a reviewer sees of a held call, from its arguments and its customer's id.
ReviewOf = Callable[[Args, str], ReviewView]


@dataclass(frozen=True, slots=True)
class ToolSpec(Generic[Args]):
    name: str
    description: str
    arguments: type[Args]
    handler: Handler[Args]
    check: Check[Args] | None = None
    writes: bool = False
    risk: Risk = Risk.LOW
    # What clients are told of the effect (MCP's tool annotations): whether it may destroy or
    # undo something (money that leaves), and whether the same call again changes nothing more.
    destructive: bool = False
    idempotent: bool = False
    # The argument that says what a call is for (a refund's order, a voucher's account): what a
    # reviewer's page names, and what money from the arguments is summed and compared by.
    subject_field: str | None = None
    # Business codes the check and the handler may answer with.
    codes: tuple[Code, ...] = ()
    label: str = ""
    # The record the call reads first (its check's read, or else its handler's), which a store
    # may read with the call's opening and hand back in the context's read_ahead.
    lookup: LookupOf[Args] | None = None
    # What a reviewer sees of the live state before deciding a held call (for a refund: the
    # order, its total, what is refunded and what remains), and the words for its action.
    review: ReviewOf[Args] | None = None
    words: ToolWords | None = None
    # What the system of record did under an idempotency key (a refund's receipt), or None if
    # nothing: how an execution whose outcome was lost is reconciled.
    outcome_of: Callable[[str], Mapping[str, Any] | None] | None = None
    # The money a call moves, which policies' thresholds and the customer's sum judge: from its
    # arguments or from its subject's state; None for a tool that moves none.
    money: MoneyFromArguments | MoneyFromState[Args] | None = None
    # The argument that names a held call's confirmation, for a read of its status: such a read
    # counts toward neither the session's step budget nor the repeat limit while that call waits
    # for a human (a confirmation of the same agent and customer, pending), so that a model can
    # ask until it is decided; any other read of the tool counts as every call does.
    watches: str | None = None
    # The effect is made by a system over the network (an upstream): a call's reservation and
    # its key, in progress, are committed before the handler runs, and nothing is locked across
    # it; the call is settled in a transaction of its own once the handler answered.
    remote: bool = False
    # A remote write's time budget: the longest its effect may take, retries included. Its key
    # in progress longer than this was left by a process that died during the effect: an
    # identical call takes it over, reading what happened before it sends again.
    lease_seconds: float = 60.0
    # What the system of record did for one call, found by its arguments rather than by its key
    # alone (an upstream that stores no key of Toolgate's), or None if nothing: how a remote
    # write with no outcome_of is settled.
    effect_of: Callable[[Any, ExecutionContext], Mapping[str, Any] | None] | None = None
    # The arguments a reviewer may change before approving a held call, each with its rule
    # (dispatch/pipeline/edits.py); none: it is approved or rejected as the model asked.
    editable: tuple[Editable, ...] = ()
    # Versions (docs/tools.md, "Versions and retirement"): the tool this one is a newer version
    # of, which stands beside it with its own allowlist entry, rules and analytics; and whether
    # this one is retired: no longer listed to agents, a call to it refused as TOOL_RETIRED
    # naming its successor, while its calls already held stay decidable by reviewers.
    replaces: str | None = None
    retired: bool = False

    def __post_init__(self) -> None:
        if self.replaces == self.name:
            raise ValueError(f"{self.name}: a tool cannot replace itself")
        money = self.money
        named = {"subject_field": self.subject_field, "watches": self.watches}
        if isinstance(money, MoneyFromArguments):
            named |= {"money's amount": money.amount, "money's currency": money.currency}
        for kind, name in named.items():
            if name is not None and name not in self.arguments.model_fields:
                raise ValueError(f"{self.name}: {kind} {name!r} is not an argument")
        for editable in self.editable:
            if editable.argument not in self.arguments.model_fields:
                raise ValueError(f"{self.name}: editable {editable.argument!r} is not an argument")
            if editable.argument == self.subject_field:
                raise ValueError(f"{self.name}: its subject {editable.argument!r} is not editable")

    @property
    def amount_field(self) -> str | None:
        """The argument that holds the amount, where the money is the arguments'."""
        money = self.money
        return money.amount if isinstance(money, MoneyFromArguments) else None

    @property
    def currency_field(self) -> str | None:
        """The argument that names the currency, where the money is the arguments'."""
        money = self.money
        return money.currency if isinstance(money, MoneyFromArguments) else None

    def watched_of(self, arguments: BaseModel) -> str | None:
        """The held call's confirmation a read of its status names, if the tool watches one."""
        return None if self.watches is None else str(getattr(arguments, self.watches))

    def subject_of(self, arguments: BaseModel) -> str:
        return "" if self.subject_field is None else str(getattr(arguments, self.subject_field))

    def money_ahead(self, arguments: BaseModel) -> Money | None:
        """The money the call moves if its arguments alone say it, before anything is read;
        None where it moves none or its subject's state says it."""
        money = self.money
        if not isinstance(money, MoneyFromArguments):
            return None
        return Money(
            int(getattr(arguments, money.amount)),
            str(getattr(arguments, money.currency)),
            self.subject_of(arguments),
        )

    def money_of(self, arguments: BaseModel, context: CheckContext) -> Money | None:
        """The money the call moves, if any, as its declaration says."""
        money = self.money
        if isinstance(money, MoneyFromState):
            return money.of(arguments, context)  # type: ignore[arg-type]
        return self.money_ahead(arguments)

    def json_schema(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()

    @property
    def title(self) -> str:
        """The action's name in headings and messages: its label, or else its name."""
        return self.label or self.name

    @property
    def action_words(self) -> ToolWords:
        """The words for its action: as declared, or plain ones made from its title."""
        if self.words is not None:
            return self.words
        noun = f"{self.title.replace('_', ' ').lower()} call"
        return ToolWords(noun=noun, plural=f"{noun}s", verb="move", past="moved")


def held_plurals(specs: Iterable[ToolSpec[Any]]) -> str:
    """What a human may be asked to decide, in the tools' own words ("refunds and vouchers"):
    the calls of high-risk tools; "held calls" where there is none."""
    held = (spec.action_words.plural for spec in specs if spec.risk is Risk.HIGH)
    plurals = list(dict.fromkeys(held))
    if not plurals:
        return "held calls"
    if len(plurals) == 1:
        return plurals[0]
    return ", ".join(plurals[:-1]) + " and " + plurals[-1]


@dataclass(frozen=True, slots=True)
class LookupSource:
    """How a store on a SQL database reads the records of one lookup source."""

    # A SELECT of at most one row, with a %(name)s placeholder for each name of a lookup's key.
    sql: str
    # The row, as a mapping of its columns, made into what the domain's own read returns.
    to_value: Callable[[Mapping[str, Any]], Any]


# What a domain's money checks read, and the only way each may change: declared in the domain's
# AppConfig as `money_guards`, rendered into PostgreSQL triggers by dispatch/store/guards.py.
# Models are named as in their app ("Order"); a ledger as "<Model>.<its foreign key>".


@dataclass(frozen=True, slots=True)
class SumOfLedger:
    """At every commit `model.column` equals the sum of `amount` over the ledger's rows that
    refer to it: it moves only with a ledger row, in the same transaction."""

    model: str
    column: str
    ledger: str
    amount: str


@dataclass(frozen=True, slots=True)
class FixedOnceInLedger:
    """`columns` of `model` change only until a ledger row refers to it: the ledger's rows were
    judged against them."""

    model: str
    columns: tuple[str, ...]
    ledger: str


@dataclass(frozen=True, slots=True)
class ChangedWithOperation:
    """Rows of `model` are inserted or deleted, and its `columns` (every one, if none is named)
    updated, only in a transaction that records a row of `operation`, named as
    "<Model>.<the column the database sets to the recording transaction>"."""

    model: str
    columns: tuple[str, ...]
    operation: str


MoneyGuard = SumOfLedger | FixedOnceInLedger | ChangedWithOperation


class VersionError(ValueError):
    """The registry's versions do not hold together: a tool replaces one that is not
    registered, two tools replace the same one, or replacements go round in a cycle."""


def check_versions(specs: Iterable[ToolSpec[Any]]) -> None:
    """Refuse versions that do not hold together (VersionError), at start-up."""
    by_name = {spec.name: spec for spec in specs}
    successors: dict[str, str] = {}
    for spec in by_name.values():
        old = spec.replaces
        if old is None:
            continue
        if old not in by_name:
            raise VersionError(f"{spec.name}: replaces {old!r}, which is not a registered tool")
        if old in successors:
            raise VersionError(
                f"{spec.name}: replaces {old!r}, which {successors[old]} already replaces "
                "(a tool has one successor)"
            )
        successors[old] = spec.name
    for spec in by_name.values():
        seen = [spec.name]
        old = spec.replaces
        while old is not None:
            if old in seen:
                chain = " -> ".join([*seen, old])
                raise VersionError(f"{spec.name}: its replacements go round in a cycle ({chain})")
            seen.append(old)
            old = by_name[old].replaces


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec[Any]] = {}
        self._lookup_sources: dict[str, LookupSource] = {}
        self._currencies: set[str] = set()
        self._catalogue = CodeCatalogue(CORE_CODES)
        # The tool of a name, or None.
        self.get: Callable[[str], ToolSpec[Any] | None] = self._tools.get

    def register(self, spec: ToolSpec[Any]) -> None:
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._catalogue = CodeCatalogue((*self._catalogue, *spec.codes))
        self._tools[spec.name] = spec

    def unregister(self, name: str) -> None:
        """Withdraw a tool (an upstream's declarations, replaced or retired); its codes stay
        known only where another tool declares them."""
        self._tools.pop(name, None)
        codes = (code for spec in self._tools.values() for code in spec.codes)
        self._catalogue = CodeCatalogue((*CORE_CODES, *codes))

    def set_retired(self, name: str, retired: bool = True) -> None:
        """Retire a registered tool (or bring it back), as a setting may at start-up."""
        spec = self._tools.get(name)
        if spec is None:
            raise ValueError(f"cannot retire {name!r}: no tool of that name is registered")
        self._tools[name] = replace(spec, retired=retired)

    def check_versions(self) -> None:
        """Refuse versions that do not hold together (VersionError)."""
        check_versions(self._tools.values())

    def successor_of(self, name: str) -> str | None:
        """The newest version that is not retired of the tool's line after it, or None: what a
        model calling a retired tool is told to call instead."""
        newer = {spec.replaces: spec for spec in self._tools.values() if spec.replaces}
        current, found = name, None
        # Bounded by the registry's size, so that a cycle (refused at start-up) cannot hang it.
        for _ in range(len(self._tools)):
            spec = newer.get(current)
            if spec is None:
                break
            current = spec.name
            if not spec.retired:
                found = spec.name
        return found

    def replaced_by(self, name: str) -> str | None:
        """The tool that declares it replaces this one, if any."""
        return next((spec.name for spec in self._tools.values() if spec.replaces == name), None)

    def version_lines(self) -> list[tuple[ToolSpec[Any], ...]]:
        """Each line of versions (a tool, the one that replaces it, ...), oldest first: only the
        tools that replace or are replaced, by the name of the line's first."""
        newer = {spec.replaces: spec for spec in self._tools.values() if spec.replaces}
        lines = []
        for first in sorted(newer.keys() - {spec.name for spec in newer.values()}):
            line = [self._tools[first]] if first in self._tools else []
            current = newer.get(first)
            while current is not None and len(line) <= len(self._tools):
                line.append(current)
                current = newer.get(current.name)
            lines.append(tuple(line))
        return lines

    def listed(self) -> Iterator[ToolSpec[Any]]:
        """The tools agents are offered: every one that is not retired."""
        return (spec for spec in self._tools.values() if not spec.retired)

    def register_lookup_source(self, name: str, source: LookupSource) -> None:
        if name in self._lookup_sources:
            raise ValueError(f"lookup source {name!r} is already registered")
        self._lookup_sources[name] = source

    def register_currencies(self, currencies: Iterable[str]) -> None:
        """The currencies a domain's tools move money in: where a policy's thresholds are set."""
        self._currencies.update(currency.upper() for currency in currencies)

    @property
    def currencies(self) -> frozenset[str]:
        return frozenset(self._currencies)

    def lookup_source(self, name: str) -> LookupSource | None:
        return self._lookup_sources.get(name)

    def __iter__(self) -> Iterator[ToolSpec[Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def catalogue(self) -> CodeCatalogue:
        return self._catalogue

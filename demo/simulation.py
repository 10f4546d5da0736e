"""Simulated agent hosts: realistic sessions, well-behaved and not, sent through the real HTTP API.

Each scenario plays one conversation the way a model gets it wrong in practice (or right). After a
rejection the simulated model does what a real one can: it reads the text it got back (HintReader)
and sends the call that text asks for; where the text does not say what to send, it guesses or
gives up. So the recovery rate of a run measures how actionable the messages are. The scenarios
speak the orders domain and are sized for the demo policy (no human below 5000 cents, at most
50000 per call).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol, TypeVar

from orders.tools import CURRENCIES, REFUND_REASON_CODES, REFUND_REASONS
from toolgate_client import (
    AuthenticationError,
    ConnectionFailedError,
    ThrottledError,
    Toolgate,
    ToolgateError,
)

Answer = TypeVar("Answer")

# Codes the simulator itself needs to tell apart; the catalogue comes from GET /api/v1/codes.
OK = "OK"
HELD = "CONFIRMATION_REQUIRED"
ENDS_A_LOOP = frozenset({"LOOP_DETECTED", "STEP_LIMIT"})
# How many corrections a simulated model sends after a rejection before it stops trying.
MAX_CORRECTIONS = 2
# When the text it got back does not say what to send, how often the model gives up rather
# than guess.
GIVE_UP_SHARE = 0.5
# A simulated model never loops forever, whatever the server answers.
MAX_REPEATS = 12
THROTTLE_RETRIES = 5


class SimulationError(Exception):
    """The simulation cannot go on; the message says what to do."""


@dataclass(frozen=True, slots=True)
class OrderFact:
    """What the simulated user knows of an order: its id, owner, total and currency."""

    order_id: str
    customer_id: str
    total_cents: int
    currency: str
    refunded_cents: int = 0

    @property
    def refundable_cents(self) -> int:
        return self.total_cents - self.refunded_cents


@dataclass(frozen=True, slots=True)
class CallRecord:
    tool: str
    code: str
    ok: bool

    @property
    def envelope_error(self) -> bool:
        # Refused before the pipeline (HTTP 4xx/5xx): no result, no audit record.
        return self.code.startswith("HTTP_")

    @property
    def passes(self) -> bool:
        return self.ok or self.code == HELD

    @property
    def rejected(self) -> bool:
        return not self.passes and not self.envelope_error


class AgentHost(Protocol):
    """What a conversation calls: the agent API over HTTP (ApiClient), or the pipeline in this
    process (demo.history)."""

    def codes(self) -> list[dict[str, Any]]: ...

    def call(
        self, *, session_id: str, customer_id: str, tool: str, arguments: str | Mapping[str, Any]
    ) -> dict[str, Any]: ...


class ApiClient:
    """The agent API through toolgate_client, with what a simulation needs around it: waits out
    throttling, and says what to do when the server is not there or refuses the token."""

    def __init__(self, *, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.reached = False

    def _toolgate(self) -> Toolgate:
        # A new client, so a new connection, per call, on purpose: Django's development server
        # answers a kept-alive connection in two small writes, which Nagle's algorithm and
        # delayed ACKs turn into a 40 ms wait per call.
        return Toolgate(self.base_url, self.token, timeout=self.timeout)

    def _send(self, operation: Callable[[Toolgate], Answer]) -> Answer:
        for attempt in range(THROTTLE_RETRIES + 1):
            try:
                with self._toolgate() as toolgate:
                    answer = operation(toolgate)
            except ConnectionFailedError as exc:
                raise self._unreachable(exc) from None
            except AuthenticationError:
                raise SimulationError(
                    f"{self.base_url} refused the token. Run `manage.py seed_demo` to set the "
                    "demo agent's token, or pass the token of an agent with --token."
                ) from None
            except ThrottledError as exc:
                self.reached = True
                if attempt == THROTTLE_RETRIES:
                    raise
                # Throttled before the pipeline ran: wait as told, then send the same call again.
                time.sleep(min(exc.retry_after or 1.0, 5.0))
                continue
            except ToolgateError:
                self.reached = True
                raise
            self.reached = True
            return answer
        raise AssertionError("unreachable")

    def _unreachable(self, exc: ConnectionFailedError) -> SimulationError:
        if exc.code == "timeout":
            return SimulationError(f"{self.base_url} did not answer within {self.timeout:g} s.")
        if self.reached:
            return SimulationError(
                f"Lost the connection to {self.base_url}: {exc.message}. Is the server still up?"
            )
        return SimulationError(
            f"Cannot connect to {self.base_url}. Start the server first (`make demo`), "
            "or point --base-url at it."
        )

    def codes(self) -> list[dict[str, Any]]:
        try:
            return self._send(lambda toolgate: toolgate.codes())
        except ToolgateError as exc:
            raise SimulationError(
                f"{self.base_url}/api/v1/codes answered {exc.status}: is this a Toolgate server?"
            ) from None

    def call(
        self, *, session_id: str, customer_id: str, tool: str, arguments: str | Mapping[str, Any]
    ) -> dict[str, Any]:
        try:
            result = self._send(
                lambda toolgate: toolgate.call(
                    tool, arguments, session_id=session_id, customer_id=customer_id
                )
            )
        except ToolgateError as exc:
            if exc.status == 200:
                raise SimulationError(
                    f"{self.base_url} answered with something else than JSON."
                ) from None
            # Refused before the pipeline: no result, no audit record.
            return {
                "ok": False,
                "code": f"HTTP_{exc.status}",
                "message": exc.message[:200],
                "data": {},
            }
        return result.as_dict()


# What a model picks out of the text it got back: each is a way a message can say what to send.
_SEND = re.compile(
    r'\bsend (?:the number )?("(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?|true|false)(?=[\s,;)]|$)'
)
_SEND_SUCH_AS = re.compile(
    r"\bsend (?:at least|at most|more than|less than) \S+, such as (-?[0-9]+)"
)
_SUCH_AS_FOR = re.compile(r"\bsuch as (-?[0-9]+) for (-?[0-9]+\.[0-9]+)")
_EXAMPLE = re.compile(r"(-?[0-9]+\.[0-9]+) is (-?[0-9]+)\b")
_SUCH_AS = re.compile(r"\bsuch as ([A-Za-z0-9_-]+)")
_MEANT = re.compile(r"\bdid you mean ([A-Za-z_][A-Za-z0-9_]*)\?")
_FIELDS = re.compile(r"\bthe only fields are: ([A-Za-z0-9_, ]+)")
_TOOLS = re.compile(r"\bthe tools you can call are: ([A-Za-z0-9_, ]+)")
_CHOICES = re.compile(
    r"""(?:is not one of|Input should be) ((?:(?:"[^"]*"|'[^']*')(?:, | or )?)+)"""
)
_QUOTED = re.compile(r""""([^"]*)"|'([^']*)'""")
_PATTERN = re.compile(r"(?:does not match|should match pattern) '?(\^\S+?\$)'?(?=[\s,;)]|$)")
_IS_IN = re.compile(r"\bis in ([A-Z]{3}), not\b")
_REFUNDABLE = re.compile(r"\bthe ([0-9]+) still refundable\b")
_BOUND_WORDS = ("greater than", "less than", "minimum", "maximum")
# Not understood: the model does not know what to send.
_UNREAD = object()


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _decimal(value: object) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _same_word(a: str, b: str) -> bool:
    return re.sub(r"[\s_-]+", "_", a.strip().lower()) == re.sub(r"[\s_-]+", "_", b.strip().lower())


class HintReader:
    """What a simulated model makes of a rejection: only what the text it got back says, and what
    it knows from the conversation (the user's order, the values it meant to send).

    It follows a hint that says what to send; it fixes what is plain to see (a case, a value from
    a listed few, a field renamed); where the text leaves it guessing, it gives up or guesses.
    The same reader is used whatever the server answers, so two runs with the same seed compare
    the messages and nothing else.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def correct(
        self,
        *,
        tool: str,
        sent: Mapping[str, Any],
        result: Mapping[str, Any],
        meant: Mapping[str, Any],
        meant_tool: str,
    ) -> tuple[str, dict[str, Any]] | None:
        """The call the model sends next, or None if it stops trying."""
        code = str(result.get("code"))
        text = str(result.get("message") or "")
        field_name = text.partition(": ")[0]
        if code == "INVALID_JSON":
            # Told its text is not one JSON object, it writes the object it meant.
            return tool, dict(meant)
        if code == "UNKNOWN_TOOL":
            offered = _TOOLS.search(text)
            if offered is None or meant_tool not in _names(offered[1]):
                return None
            return meant_tool, dict(sent)
        if code == "INVALID_ARGUMENTS":
            fixed = self._arguments(sent, meant, text)
            return None if fixed is None else (tool, fixed)
        if code == "CURRENCY_MISMATCH" and (found := _IS_IN.search(text)):
            return tool, {**sent, field_name: found[1]}
        if code == "AMOUNT_EXCEEDS_REFUNDABLE" and (found := _REFUNDABLE.search(text)):
            # Told what is left, it sends the amount the user asked for if that fits; if not, it
            # asks the user rather than refund everything that is left.
            asked = meant.get(field_name)
            if isinstance(asked, int) and asked != sent.get(field_name) and asked <= int(found[1]):
                return tool, {**sent, field_name: asked}
            return None
        if code == "ORDER_NOT_FOUND" and "ask" in text and field_name in meant:
            # It asks the user, as told, and the user gives the id they meant.
            return tool, {**sent, field_name: meant[field_name]}
        return None

    def _arguments(
        self, sent: Mapping[str, Any], meant: Mapping[str, Any], text: str
    ) -> dict[str, Any] | None:
        fixed = dict(sent)
        parts = [part.partition(": ") for part in text.split("; ")]
        # Unknown fields first: one the message renames is then no longer missing.
        for _, _, hint in parts:
            allowed = _FIELDS.search(hint)
            if allowed is None:
                continue
            meant_name = _MEANT.search(hint)
            for key in [key for key in fixed if key not in _names(allowed[1])]:
                value = fixed.pop(key)
                if meant_name is not None and meant_name[1] not in fixed:
                    fixed[meant_name[1]] = value
        for name, _, hint in parts:
            if _FIELDS.search(hint):
                continue
            if "required" in hint:
                if name not in fixed:
                    if name not in meant:
                        return None
                    fixed[name] = meant[name]
                continue
            value = self._value(fixed.get(name), hint)
            if value is _UNREAD:
                if self.rng.random() < GIVE_UP_SHARE:
                    return None
                value = self._guess(fixed.get(name), hint)
            fixed[name] = value
        return fixed

    def _value(self, value: Any, hint: str) -> Any:
        if send := _SEND.search(hint):
            return json.loads(send[1])
        if send := _SEND_SUCH_AS.search(hint):
            return int(send[1])
        if choices := _CHOICES.search(hint):
            options = [a or b for a, b in _QUOTED.findall(choices[1])]
            if isinstance(value, str):
                for option in options:
                    if _same_word(option, value):
                        return option
            return _UNREAD
        if any(word in hint for word in _BOUND_WORDS):
            return _UNREAD
        number = _decimal(value)
        if "integer" in hint and number is not None:
            return self._integer(number, hint)
        if "string" in hint and number is not None and not isinstance(value, str):
            return str(value)
        if (pattern := _PATTERN.search(hint)) and isinstance(value, str):
            return self._matching(value, pattern[1], hint)
        return _UNREAD

    def _integer(self, number: Decimal, hint: str) -> Any:
        example = _SUCH_AS_FOR.search(hint)
        minor, major = (example[1], example[2]) if example else (None, None)
        if example is None and (stated := _EXAMPLE.search(hint)):
            major, minor = stated[1], stated[2]
        whole = number == number.to_integral_value()
        if minor is None or major is None:
            return int(number) if whole else _UNREAD
        if example is not None and Decimal(major) == number:
            # "such as 100 for 1.00", and it sent 1.00.
            return int(minor)
        factor = Decimal(minor) / Decimal(major)
        if whole:
            # Already in the unit of the example, or still in the larger one? The text does not say.
            return self.rng.choice([int(number), int(number * factor)])
        scaled = number * factor
        return int(scaled) if scaled == scaled.to_integral_value() else _UNREAD

    def _matching(self, value: str, pattern: str, hint: str) -> Any:
        if not value.isascii():
            # Look-alike characters (a Cyrillic O, full-width digits) look right to the model
            # that wrote them: it sees nothing to change.
            return _UNREAD
        candidates = [value.strip(), value.upper(), value.strip().upper()]
        example = _SUCH_AS.search(hint)
        digits = "".join(char for char in value if char in "0123456789")
        if example is not None and digits:
            # The example's shape with the digits it sent: the user's "1001" as ORD-1001.
            candidates.append(re.sub("[0-9]+", digits, example[1], count=1))
        try:
            compiled = re.compile(pattern)
        except re.error:
            return _UNREAD
        for candidate in candidates:
            if candidate != value and compiled.search(candidate):
                return candidate
        return _UNREAD

    def _guess(self, value: Any, hint: str) -> Any:
        if choices := _CHOICES.search(hint):
            return self.rng.choice([a or b for a, b in _QUOTED.findall(choices[1])])
        number = _decimal(value)
        if number is not None:
            return self.rng.choice([abs(int(number)), int(number), int(number * 100), str(value)])
        if isinstance(value, str):
            return self.rng.choice([value.strip(), value.upper(), value])
        return value


class Conversation:
    """One session: the customer the host vouched for, one of their orders, and the calls."""

    def __init__(
        self,
        *,
        client: AgentHost,
        session_id: str,
        order: OrderFact,
        other_order: OrderFact | None,
        known_order_ids: frozenset[str],
        rng: random.Random,
        fixable: frozenset[str] = frozenset(),
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.order = order
        self.other_order = other_order
        self.known_order_ids = known_order_ids
        self.rng = rng
        # The codes the catalogue says a model can fix: after those, the model tries again.
        self.fixable = fixable
        self.reader = HintReader(rng)
        # OpenAI-style hosts pass the model's text; Anthropic-style ones a parsed object.
        self.as_text = rng.random() < 0.6
        self.calls: list[CallRecord] = []

    def call(self, tool: str, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
        if self.as_text and not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        result = self.client.call(
            session_id=self.session_id,
            customer_id=self.order.customer_id,
            tool=tool,
            arguments=arguments,
        )
        self.calls.append(CallRecord(tool=tool, code=str(result["code"]), ok=bool(result["ok"])))
        return result

    def read_order(self, order_id: str | None = None) -> dict[str, Any] | None:
        result = self.call("get_order", {"order_id": order_id or self.order.order_id})
        return dict(result["data"]) if result["ok"] else None

    def amount_to_refund(self) -> int | None:
        """Reads the order first, and picks an amount of what is left; None if nothing is left
        (the model tells the user so, and refunds nothing)."""
        left = self.refundable(self.read_order())
        return self.amount(left) if left >= 100 else None

    def refundable(self, read: Mapping[str, Any] | None) -> int:
        if read is not None and isinstance(read.get("refundable_cents"), int):
            return int(read["refundable_cents"])
        return self.order.refundable_cents

    def amount(self, refundable: int, *, large: bool = False) -> int:
        """An amount within what is refundable; large ones are held for a human."""
        if large and refundable >= 5_000:
            return self.rng.randint(5_000, min(refundable, 40_000))
        return self.rng.randint(100, max(100, min(refundable, 2_500)))

    def refund(
        self,
        amount_cents: Any,
        *,
        order_id: str | None = None,
        currency: str | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        return {
            "order_id": order_id or self.order.order_id,
            "amount_cents": amount_cents,
            "currency": currency or self.order.currency,
            "reason": reason or self.rng.choice(REFUND_REASONS),
        }

    def refund_v2(self, amount_cents: int) -> dict[str, Any]:
        """refund_order_v2's arguments: v1's, with a reason code instead of its reason."""
        arguments = self.refund(amount_cents)
        del arguments["reason"]
        return {**arguments, "reason_code": self.rng.choice(REFUND_REASON_CODES)}

    def attempt(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        meant: Mapping[str, Any] | None = None,
        meant_tool: str | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        """Send a call as the model wrote it (`text`, if its text is not the arguments' JSON);
        after a rejection it can fix, the model reads what came back and sends its correction,
        up to MAX_CORRECTIONS times. `meant` is what it meant to send: what it knows from the
        conversation when told a field is missing, or to ask the user."""
        meant = arguments if meant is None else meant
        sent = dict(arguments)
        result = self.call(tool, arguments if text is None else text)
        for _ in range(MAX_CORRECTIONS):
            if result["ok"] or result["code"] not in self.fixable:
                break
            correction = self.reader.correct(
                tool=tool, sent=sent, result=result, meant=meant, meant_tool=meant_tool or tool
            )
            if correction is None:
                break
            tool, sent = correction
            result = self.call(tool, sent)
        return result

    def invented_order_id(self) -> str:
        digits = self.order.order_id.removeprefix("ORD-")
        candidates = [
            f"ORD-{digits}0",
            f"ORD-{digits[::-1]}",
            f"ORD-{int(digits) + 7 if digits.isdigit() else 7}",
        ]
        self.rng.shuffle(candidates)
        for candidate in candidates:
            if candidate not in self.known_order_ids and len(candidate) <= 16:
                return candidate
        while True:
            candidate = f"ORD-{self.rng.randint(10**6, 10**7 - 1)}"
            if candidate not in self.known_order_ids:
                return candidate


Scenario = Callable[[Conversation], None]


def good(c: Conversation) -> None:
    """Reads the order, then refunds part of it in its own currency, in integer cents."""
    read = c.read_order()
    if read is None or c.refundable(read) < 100:
        return
    amount = c.amount(c.refundable(read), large=c.rng.random() < 0.3)
    c.call("refund_order", c.refund(amount))


def good_v2(c: Conversation) -> None:
    """A host moved to refund_order_v2: reads the order and refunds it with a reason code; a
    model used to v1 sometimes sends v1's reason first, and corrects it from the message."""
    read = c.read_order()
    if read is None or c.refundable(read) < 100:
        return
    meant = c.refund_v2(c.amount(c.refundable(read), large=c.rng.random() < 0.3))
    if c.rng.random() < 0.4:
        habit = {key: value for key, value in meant.items() if key != "reason_code"}
        habit["reason"] = c.rng.choice(REFUND_REASONS)
        c.attempt("refund_order_v2", habit, meant=meant)
        return
    c.call("refund_order_v2", meant)


def extra_field(c: Conversation) -> None:
    """Invents an argument the tool does not have."""
    if c.rng.random() < 0.4:
        invented = c.rng.choice(["include_items", "verbose", "with_history"])
        read = {"order_id": c.order.order_id}
        c.attempt("get_order", {**read, invented: True}, meant=read)
        return
    amount = c.amount_to_refund()
    if amount is None:
        return
    meant = c.refund(amount)
    name, value = c.rng.choice(
        [
            ("customer_id", c.order.customer_id),
            ("notify_customer", True),
            ("note", "customer called twice"),
            ("refund_shipping", True),
        ]
    )
    c.attempt("refund_order", {**meant, name: value}, meant=meant)


# The names a model gives an argument when it does not use the declared one.
_OWN_NAMES = {
    "order_id": "order",
    "amount_cents": "amount",
    "currency": "currency_code",
    "reason": "refund_reason",
}


def missing_field(c: Conversation) -> None:
    """Leaves out a required argument, or sends it under a name of its own."""
    amount = c.amount_to_refund()
    if amount is None:
        return
    meant = c.refund(amount)
    name = c.rng.choice(list(_OWN_NAMES))
    sent = {key: value for key, value in meant.items() if key != name}
    if c.rng.random() < 0.5:
        sent[_OWN_NAMES[name]] = meant[name]
    c.attempt("refund_order", sent, meant=meant)


def float_amount(c: Conversation) -> None:
    """Sends the amount as a float: in major units (25.9 for 2590 cents), or the right number
    written as a float (2590.0)."""
    amount = c.amount_to_refund()
    if amount is None:
        return
    if c.rng.random() < 0.6:
        if amount % 100 == 0:
            amount -= 1
        value = amount / 100
    else:
        value = float(amount)
    meant = c.refund(amount)
    c.attempt("refund_order", {**meant, "amount_cents": value}, meant=meant)


def string_amount(c: Conversation) -> None:
    """Sends the amount as a string: "25.90", or "2590"."""
    amount = c.amount_to_refund()
    if amount is None:
        return
    text = f"{amount / 100:.2f}" if c.rng.random() < 0.7 else str(amount)
    meant = c.refund(amount)
    c.attempt("refund_order", {**meant, "amount_cents": text}, meant=meant)


def sloppy_value(c: Conversation) -> None:
    """Writes a value in its own way: "brl" for BRL, "not delivered", a refund as a negative
    amount."""
    amount = c.amount_to_refund()
    if amount is None:
        return
    meant = c.refund(amount)
    name, value = c.rng.choice(
        [
            ("currency", str(meant["currency"]).lower()),
            ("reason", str(meant["reason"]).replace("_", " ")),
            ("reason", str(meant["reason"]).capitalize()),
            ("amount_cents", -amount),
        ]
    )
    c.attempt("refund_order", {**meant, name: value}, meant=meant)


def _full_width(text: str) -> str:
    return "".join(chr(0xFF10 + int(char)) if char.isdigit() else char for char in text)


def sloppy_order_id(c: Conversation) -> None:
    """Writes the id the user gave in its own way: lower case, a space for the hyphen, a
    trailing newline, a bare number, or in full-width digits copied from the user's message."""
    order_id = c.order.order_id
    digits = order_id.removeprefix("ORD-")
    written: Any = c.rng.choice(
        [
            order_id.lower(),
            order_id.replace("-", " "),
            f"{order_id}\n",
            int(digits) if digits.isdigit() else digits,
            f"ORD-{_full_width(digits)}",
        ]
    )
    if c.rng.random() < 0.5:
        c.attempt("get_order", {"order_id": written}, meant={"order_id": order_id})
        return
    meant = c.refund(c.amount(c.order.refundable_cents))
    c.attempt("refund_order", {**meant, "order_id": written}, meant=meant)


def wrong_currency(c: Conversation) -> None:
    """Refunds in another currency than the order's (the user said "dollars")."""
    read = c.read_order() if c.rng.random() < 0.5 else None
    amount = c.amount(c.refundable(read))
    wrong = c.rng.choice([code for code in CURRENCIES if code != c.order.currency])
    c.attempt("refund_order", c.refund(amount, currency=wrong))


def invented_order(c: Conversation) -> None:
    """Calls with an order id that looks right and does not exist, then asks the user."""
    invented = c.invented_order_id()
    if c.rng.random() < 0.5:
        c.attempt("get_order", {"order_id": invented}, meant={"order_id": c.order.order_id})
        return
    meant = c.refund(c.amount(c.order.refundable_cents))
    c.attempt("refund_order", {**meant, "order_id": invented}, meant=meant)


def refund_for_read(c: Conversation) -> None:
    """Asked "what is my order's status?", refunds it in full; then reads it."""
    c.call("refund_order", c.refund(c.order.total_cents, reason="customer_request"))
    c.read_order()


def retry_loop(c: Conversation) -> None:
    """Sends the very same call again and again, until Toolgate stops it."""
    variant = c.rng.choice(["read", "wrong_currency", "held"])
    tool, arguments = "get_order", {"order_id": c.order.order_id}
    if variant == "wrong_currency":
        wrong = c.rng.choice([code for code in CURRENCIES if code != c.order.currency])
        tool, arguments = (
            "refund_order",
            c.refund(c.amount(c.order.refundable_cents), currency=wrong),
        )
    elif variant == "held" and c.order.refundable_cents >= 5_000:
        tool, arguments = "refund_order", c.refund(c.amount(c.order.refundable_cents, large=True))
    for _ in range(MAX_REPEATS):
        code = str(c.call(tool, arguments)["code"])
        if code in ENDS_A_LOOP or code.startswith("HTTP_"):
            return


def injection(c: Conversation) -> None:
    """Text in the context says "refund ORD-1002 in full": another customer's order."""
    target = c.other_order
    order_id = target.order_id if target else c.invented_order_id()
    if c.rng.random() < 0.3:
        c.call("get_order", {"order_id": order_id})
    c.call(
        "refund_order",
        c.refund(
            target.total_cents if target else 10_000,
            order_id=order_id,
            currency=target.currency if target else c.order.currency,
        ),
    )


def _not_json(arguments: Mapping[str, Any], rng: random.Random) -> str:
    text = json.dumps(arguments)
    first = next(iter(arguments))
    broken = [
        text[:-1],  # cut off
        text[:-1] + ",}",  # trailing comma
        repr(dict(arguments)),  # a Python dict, single quotes
        f"```json\n{text}\n```",  # fenced as markdown
        text + text,  # two objects
        f'{{"{first}": {json.dumps(arguments[first])}, {text[1:]}',  # a duplicated key
        "; ".join(f"{key}: {value}" for key, value in arguments.items()),  # prose
    ]
    return rng.choice(broken)


def non_json(c: Conversation) -> None:
    """Produces argument text that is not one strict JSON object."""
    if c.rng.random() < 0.5:
        arguments: dict[str, Any] = {"order_id": c.order.order_id}
        tool = "get_order"
    else:
        amount = c.amount_to_refund()
        if amount is None:
            return
        arguments = c.refund(amount)
        tool = "refund_order"
    c.attempt(tool, arguments, text=_not_json(arguments, c.rng))


def unknown_tool(c: Conversation) -> None:
    """Calls a tool that does not exist to read an order, then the one that does."""
    name = c.rng.choice(["lookup_order", "fetch_order", "order_status", "get_order_details"])
    c.attempt(name, {"order_id": c.order.order_id}, meant_tool="get_order")


SCENARIOS: dict[str, Scenario] = {
    "good": good,
    "good_v2": good_v2,
    "extra_field": extra_field,
    "missing_field": missing_field,
    "float_amount": float_amount,
    "string_amount": string_amount,
    "sloppy_value": sloppy_value,
    "sloppy_order_id": sloppy_order_id,
    "wrong_currency": wrong_currency,
    "invented_order": invented_order,
    "refund_for_read": refund_for_read,
    "retry_loop": retry_loop,
    "injection": injection,
    "non_json": non_json,
    "unknown_tool": unknown_tool,
}

DEFAULT_MIX: dict[str, int] = {
    "good": 40,
    "good_v2": 12,
    "extra_field": 6,
    "missing_field": 6,
    "float_amount": 6,
    "string_amount": 4,
    "sloppy_value": 5,
    "sloppy_order_id": 5,
    "wrong_currency": 6,
    "invented_order": 6,
    "refund_for_read": 4,
    "retry_loop": 6,
    "injection": 6,
    "non_json": 5,
    "unknown_tool": 5,
}


def parse_mix(text: str) -> dict[str, int]:
    """`good=40,float_amount=10`: the scenarios to play and their weights; others are left out."""
    mix: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, weight = part.partition("=")
        name = name.strip()
        if name not in SCENARIOS:
            raise SimulationError(
                f"Unknown scenario {name!r} in --mix; the scenarios are: {', '.join(SCENARIOS)}."
            )
        if not sep or not weight.strip().isdigit():
            raise SimulationError(f"--mix: give each scenario a whole weight, as {name}=10.")
        mix[name] = int(weight)
    if sum(mix.values()) <= 0:
        raise SimulationError("--mix: at least one scenario needs a weight above 0.")
    return mix


def allocate(mix: Mapping[str, int], sessions: int, rng: random.Random) -> list[str]:
    """Split the sessions among scenarios by weight (largest remainder), in a random order.

    Exact shares rather than a draw per session, so that even a short run plays each scenario
    whose share is at least one session.
    """
    total = sum(mix.values())
    exact = {name: sessions * weight / total for name, weight in mix.items()}
    counts = {name: int(share) for name, share in exact.items()}
    left = sessions - sum(counts.values())
    by_remainder = sorted(exact, key=lambda name: (counts[name] - exact[name], name))
    for name in by_remainder[:left]:
        counts[name] += 1
    plan = [name for name in mix for _ in range(counts[name])]
    rng.shuffle(plan)
    return plan


@dataclass(frozen=True, slots=True)
class SessionReport:
    scenario: str
    session_id: str
    calls: tuple[CallRecord, ...]


@dataclass
class SimulationReport:
    run_id: str
    seed: int
    sessions: list[SessionReport]
    elapsed_seconds: float
    # When the run began and ended, by this machine's clock: the range of its audit records.
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def calls(self) -> list[CallRecord]:
        return [call for session in self.sessions for call in session.calls]

    def codes(self) -> Counter[str]:
        return Counter(call.code for call in self.calls if not call.envelope_error)

    def lines(self) -> list[str]:
        calls = self.calls
        codes = self.codes()
        results = sum(codes.values())
        envelope_errors = Counter(call.code for call in calls if call.envelope_error)
        rate = len(calls) / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0
        out = [
            f"Run {self.run_id} (seed {self.seed}): {len(self.sessions)} sessions, "
            f"{len(calls)} calls in {self.elapsed_seconds:.1f} s ({rate:.0f} calls/s).",
            "",
            "Outcomes by code (one audit record each):",
            f"  {'code':<28}{'calls':>7}{'%':>8}",
        ]
        for code, number in sorted(codes.items(), key=lambda item: (-item[1], item[0])):
            out.append(f"  {code:<28}{number:>7}{_percent(number, results):>8}")
        out.append(f"  {'total':<28}{results:>7}{_percent(results, results):>8}")
        if envelope_errors:
            out += ["", "Refused before the pipeline (no audit record):"]
            for code, number in sorted(envelope_errors.items()):
                out.append(f"  {code:<28}{number:>7}")

        out += [
            "",
            "By scenario:",
            f"  {'scenario':<18}{'sessions':>9}{'calls':>7}{'ok':>6}{'held':>6}{'rejected':>10}",
        ]
        for name in sorted({session.scenario for session in self.sessions}):
            played = [session for session in self.sessions if session.scenario == name]
            its_calls = [call for session in played for call in session.calls]
            out.append(
                f"  {name:<18}{len(played):>9}{len(its_calls):>7}"
                f"{sum(call.ok for call in its_calls):>6}"
                f"{sum(call.code == HELD for call in its_calls):>6}"
                f"{sum(call.rejected for call in its_calls):>10}"
            )
        rejected = sum(call.rejected for call in calls)
        out += [
            "",
            f"Rejection rate: {_percent(rejected, results).strip()} ({rejected} of {results} "
            "calls; held calls are not rejections).",
        ]
        return out


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def run_simulation(
    *,
    client: AgentHost,
    orders: Sequence[OrderFact],
    sessions: int,
    mix: Mapping[str, int],
    seed: int,
    run_id: str,
    concurrency: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationReport:
    """Play the sessions; each draws from its own seeded generator, so a seed replays a run."""
    if not orders:
        raise SimulationError("No orders to play with: run `manage.py seed_demo` first.")
    fixable = frozenset(str(code["code"]) for code in client.codes() if code.get("model_fixable"))
    plan = allocate(mix, sessions, random.Random(seed))
    known = frozenset(order.order_id for order in orders)
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    reports: list[SessionReport | None] = [None] * len(plan)
    lock = threading.Lock()
    done = 0

    def play(index: int) -> None:
        nonlocal done
        rng = random.Random(f"{seed}:{index}")
        order = rng.choice(orders)
        others = [other for other in orders if other.customer_id != order.customer_id]
        conversation = Conversation(
            client=client,
            session_id=f"sim-{run_id}-{index:05d}",
            order=order,
            other_order=rng.choice(others) if others else None,
            known_order_ids=known,
            rng=rng,
            fixable=fixable,
        )
        SCENARIOS[plan[index]](conversation)
        with lock:
            reports[index] = SessionReport(
                plan[index], conversation.session_id, tuple(conversation.calls)
            )
            done += 1
            if progress is not None:
                progress(done, sum(len(r.calls) for r in reports if r is not None))

    if concurrency <= 1:
        # In this thread, on its database connection (and inside its transaction, if any).
        for index in range(len(plan)):
            play(index)
        return _report(run_id, seed, reports, started, started_at)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(play, index) for index in range(len(plan))]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in finished if f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            error = failed.exception()
            assert error is not None
            raise error

    return _report(run_id, seed, reports, started, started_at)


def _report(
    run_id: str,
    seed: int,
    reports: Sequence[SessionReport | None],
    started: float,
    started_at: datetime,
) -> SimulationReport:
    return SimulationReport(
        run_id=run_id,
        seed=seed,
        sessions=[report for report in reports if report is not None],
        elapsed_seconds=time.perf_counter() - started,
        started_at=started_at,
        finished_at=datetime.now(UTC),
    )


def orders_from_json(document: Any) -> list[OrderFact]:
    """`[{"order_id", "customer_id", "total_cents", "currency", "refunded_cents"?}, ...]`"""
    if not isinstance(document, list):
        raise SimulationError("--orders must be a JSON list of orders.")
    facts = []
    for item in document:
        try:
            facts.append(
                OrderFact(
                    order_id=str(item["order_id"]),
                    customer_id=str(item["customer_id"]),
                    total_cents=int(item["total_cents"]),
                    currency=str(item["currency"]),
                    refunded_cents=int(item.get("refunded_cents", 0)),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SimulationError(
                "--orders: each order needs order_id, customer_id, total_cents and currency; "
                f"this one does not: {json.dumps(item)[:200]}"
            ) from None
    return facts

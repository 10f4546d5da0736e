"""Simulated agent hosts: realistic sessions, well-behaved and not, sent through the real HTTP API.

Each scenario plays one conversation the way a model gets it wrong in practice (or right), and
where a real model would, it reads the rejection and sends the corrected call, so that the
recovery metric has something to measure. The scenarios speak the orders domain and are sized
for the demo policy (no human below 5000 cents, at most 50000 per call).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import requests

from orders.tools import CURRENCIES, REFUND_REASONS

# Codes the simulator itself needs to tell apart; the catalogue comes from GET /api/v1/codes.
OK = "OK"
HELD = "CONFIRMATION_REQUIRED"
ENDS_A_LOOP = frozenset({"LOOP_DETECTED", "STEP_LIMIT"})
# What the recovery metric counts: a fixable rejection followed, within this many calls of the
# same session, by a call to the same tool that passes (ok, or held for a human).
RECOVERY_WINDOW = 3
# Of the sessions whose model could fix its call, how many give up instead.
GIVE_UP_SHARE = 0.2
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


class ApiClient:
    """The agent API over HTTP."""

    def __init__(self, *, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Token {token}"}
        self.timeout = timeout
        self.reached = False

    def _send(self, method: str, path: str, body: Any = None) -> requests.Response:
        url = f"{self.base_url}{path}"
        for _ in range(THROTTLE_RETRIES + 1):
            try:
                # A new connection per call, on purpose: Django's development server answers a
                # kept-alive connection in two small writes, which Nagle's algorithm and delayed
                # ACKs turn into a 40 ms wait per call.
                response = requests.request(
                    method, url, json=body, headers=self.headers, timeout=self.timeout
                )
            except requests.ConnectionError as exc:
                if self.reached:
                    raise SimulationError(
                        f"Lost the connection to {self.base_url}: {exc}. Is the server still up?"
                    ) from None
                raise SimulationError(
                    f"Cannot connect to {self.base_url}. Start the server first (`make demo`), "
                    "or point --base-url at it."
                ) from None
            except requests.Timeout:
                raise SimulationError(
                    f"{self.base_url} did not answer within {self.timeout:g} s."
                ) from None
            self.reached = True
            if response.status_code == 401:
                raise SimulationError(
                    f"{self.base_url} refused the token. Run `manage.py seed_demo` to set the "
                    "demo agent's token, or pass the token of an agent with --token."
                )
            if response.status_code != 429:
                return response
            # Throttled before the pipeline ran: wait as told, then send the same call again.
            time.sleep(min(float(response.headers.get("Retry-After") or 1), 5.0))
        return response

    def codes(self) -> list[dict[str, Any]]:
        response = self._send("GET", "/api/v1/codes")
        document = _json_of(response, self.base_url)
        if response.status_code != 200 or not isinstance(document, dict):
            raise SimulationError(
                f"{self.base_url}/api/v1/codes answered {response.status_code}: "
                "is this a Toolgate server?"
            )
        return list(document.get("codes", []))

    def call(
        self, *, session_id: str, customer_id: str, tool: str, arguments: str | Mapping[str, Any]
    ) -> dict[str, Any]:
        envelope = {
            "session_id": session_id,
            "customer_id": customer_id,
            "tool": tool,
            "arguments": arguments,
        }
        response = self._send("POST", "/api/v1/calls", envelope)
        document = _json_of(response, self.base_url)
        if response.status_code == 200 and isinstance(document, dict) and "code" in document:
            return document
        error = document.get("error", {}) if isinstance(document, dict) else {}
        return {
            "ok": False,
            "code": f"HTTP_{response.status_code}",
            "message": str(error.get("message", ""))[:200],
            "data": {},
        }


def _json_of(response: requests.Response, base_url: str) -> Any:
    try:
        return response.json()
    except ValueError:
        if response.status_code == 200:
            raise SimulationError(f"{base_url} answered with something else than JSON.") from None
        return None


class Conversation:
    """One session: the customer the host vouched for, one of their orders, and the calls."""

    def __init__(
        self,
        *,
        client: ApiClient,
        session_id: str,
        order: OrderFact,
        other_order: OrderFact | None,
        known_order_ids: frozenset[str],
        rng: random.Random,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.order = order
        self.other_order = other_order
        self.known_order_ids = known_order_ids
        self.rng = rng
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

    def recovers(self, result: Mapping[str, Any]) -> bool:
        """Whether the model, told what was wrong, sends the corrected call."""
        return not result["ok"] and self.rng.random() >= GIVE_UP_SHARE

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


def extra_field(c: Conversation) -> None:
    """Invents an argument the tool does not have."""
    if c.rng.random() < 0.4:
        invented = c.rng.choice(["include_items", "verbose", "with_history"])
        result = c.call("get_order", {"order_id": c.order.order_id, invented: True})
        if c.recovers(result):
            c.read_order()
        return
    amount = c.amount(c.refundable(c.read_order()))
    name, value = c.rng.choice(
        [
            ("customer_id", c.order.customer_id),
            ("notify_customer", True),
            ("note", "customer called twice"),
            ("refund_shipping", True),
        ]
    )
    result = c.call("refund_order", {**c.refund(amount), name: value})
    if c.recovers(result):
        c.call("refund_order", c.refund(amount))


def missing_field(c: Conversation) -> None:
    """Leaves out a required argument."""
    amount = c.amount(c.refundable(c.read_order()))
    arguments = c.refund(amount)
    del arguments[c.rng.choice(["currency", "reason", "amount_cents"])]
    result = c.call("refund_order", arguments)
    if c.recovers(result):
        c.call("refund_order", c.refund(amount))


def float_amount(c: Conversation) -> None:
    """Sends the amount in major units, as a float: 25.9 for 2590 cents."""
    amount = c.amount(c.refundable(c.read_order()))
    if amount % 100 == 0:
        amount -= 1
    result = c.call("refund_order", c.refund(amount / 100))
    if c.recovers(result):
        c.call("refund_order", c.refund(amount))


def string_amount(c: Conversation) -> None:
    """Sends the amount as a string: "25.90", or "2590"."""
    amount = c.amount(c.refundable(c.read_order()))
    text = f"{amount / 100:.2f}" if c.rng.random() < 0.7 else str(amount)
    result = c.call("refund_order", c.refund(text))
    if c.recovers(result):
        c.call("refund_order", c.refund(amount))


def wrong_currency(c: Conversation) -> None:
    """Refunds in another currency than the order's (the user said "dollars")."""
    read = c.read_order() if c.rng.random() < 0.5 else None
    amount = c.amount(c.refundable(read))
    wrong = c.rng.choice([code for code in CURRENCIES if code != c.order.currency])
    result = c.call("refund_order", c.refund(amount, currency=wrong))
    if c.recovers(result):
        currency = result["data"].get("order_currency") or c.order.currency
        c.call("refund_order", c.refund(amount, currency=str(currency)))


def invented_order(c: Conversation) -> None:
    """Calls with an order id that looks right and does not exist, then asks the user."""
    invented = c.invented_order_id()
    if c.rng.random() < 0.5:
        result = c.call("get_order", {"order_id": invented})
        if c.recovers(result):
            c.read_order()
        return
    amount = c.amount(c.order.refundable_cents)
    result = c.call("refund_order", c.refund(amount, order_id=invented))
    if c.recovers(result):
        c.call("refund_order", c.refund(amount))


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
        arguments = c.refund(c.amount(c.refundable(c.read_order())))
        tool = "refund_order"
    result = c.call(tool, _not_json(arguments, c.rng))
    if c.recovers(result):
        c.call(tool, arguments)


def unknown_tool(c: Conversation) -> None:
    """Calls a tool that does not exist, then the one that does."""
    name = c.rng.choice(["cancel_order", "issue_refund", "lookup_order", "refund", "get_customer"])
    result = c.call(name, {"order_id": c.order.order_id})
    if c.recovers(result):
        c.read_order()


SCENARIOS: dict[str, Scenario] = {
    "good": good,
    "extra_field": extra_field,
    "missing_field": missing_field,
    "float_amount": float_amount,
    "string_amount": string_amount,
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
    "extra_field": 6,
    "missing_field": 6,
    "float_amount": 6,
    "string_amount": 4,
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

    def recoveries(self, fixable: frozenset[str]) -> tuple[int, int]:
        """(fixable rejections, of them recovered) by the recovery metric's definition."""
        candidates = recovered = 0
        for index, call in enumerate(self.calls):
            if not call.rejected or call.code not in fixable:
                continue
            candidates += 1
            window = self.calls[index + 1 : index + 1 + RECOVERY_WINDOW]
            if any(later.tool == call.tool and later.passes for later in window):
                recovered += 1
        return candidates, recovered


@dataclass
class SimulationReport:
    run_id: str
    seed: int
    sessions: list[SessionReport]
    elapsed_seconds: float
    fixable: frozenset[str] = field(default_factory=frozenset)

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
            f"  {'scenario':<18}{'sessions':>9}{'calls':>7}{'ok':>6}{'held':>6}"
            f"{'rejected':>10}{'recovered':>11}",
        ]
        total_candidates = total_recovered = 0
        for name in sorted({session.scenario for session in self.sessions}):
            played = [session for session in self.sessions if session.scenario == name]
            its_calls = [call for session in played for call in session.calls]
            candidates = recovered = 0
            for session in played:
                found, fixed = session.recoveries(self.fixable)
                candidates += found
                recovered += fixed
            total_candidates += candidates
            total_recovered += recovered
            out.append(
                f"  {name:<18}{len(played):>9}{len(its_calls):>7}"
                f"{sum(call.ok for call in its_calls):>6}"
                f"{sum(call.code == HELD for call in its_calls):>6}"
                f"{sum(call.rejected for call in its_calls):>10}"
                f"{f'{recovered}/{candidates}' if candidates else '-':>11}"
            )
        rejected = sum(call.rejected for call in calls)
        out += [
            "",
            f"Rejection rate: {_percent(rejected, results).strip()} ({rejected} of {results} "
            "calls; held calls are not rejections).",
            f"Recovery rate: {_percent(total_recovered, total_candidates).strip()} "
            f"({total_recovered} of {total_candidates} fixable rejections were followed within "
            f"{RECOVERY_WINDOW} calls by a passing call to the same tool).",
        ]
        return out


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def run_simulation(
    *,
    client: ApiClient,
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
        )
        SCENARIOS[plan[index]](conversation)
        with lock:
            reports[index] = SessionReport(
                plan[index], conversation.session_id, tuple(conversation.calls)
            )
            done += 1
            if progress is not None:
                progress(done, sum(len(r.calls) for r in reports if r is not None))

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = [pool.submit(play, index) for index in range(len(plan))]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in finished if f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            error = failed.exception()
            assert error is not None
            raise error

    return SimulationReport(
        run_id=run_id,
        seed=seed,
        sessions=[report for report in reports if report is not None],
        elapsed_seconds=time.perf_counter() - started,
        fixable=fixable,
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

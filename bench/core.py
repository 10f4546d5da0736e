"""Benchmark (a): the pipeline core in-process, against a naive loop with no checks.

Both sides get the same raw calls, as a model would emit them: a tool name and its arguments as
JSON text. The core runs them through `dispatch.pipeline.Pipeline` on `InMemoryState` with the
order tools on an `InMemoryOrderBook`, with the real clock, sleep and ids. The naive loop does
what an integration without Toolgate does: `json.loads` the arguments and calls the tool's
handler directly, with no schema, no idempotency, no business check, no policy and no audit;
a call that crashes the handler is caught and counted.

The mix is fixed and seeded. Every session holds 20 calls (a new session id every 20 calls, so the
step budget is never reached), and each session is made of exactly:

    8  get_order of an existing order                                   40%  OK
    4  refund_order below the auto-approve amount                       20%  OK (really executed)
    2  refund_order at or above it                                      10%  CONFIRMATION_REQUIRED
    6  bad calls, the kinds taken in turn from the 7 below              30%

    invalid_json     arguments that are not JSON (cut off)              INVALID_JSON
    float_amount     amount_cents 25.9 instead of 2590                  INVALID_ARGUMENTS
    wrong_currency   a refund in USD on an order in BRL                 CURRENCY_MISMATCH
    invented_order   an order id that does not exist                    ORDER_NOT_FOUND
    extra_field      an argument the tool does not take                 INVALID_ARGUMENTS
    unknown_tool     a tool that does not exist                         UNKNOWN_TOOL
    replay           an exact repeat of a refund of the same session    OK, replayed

The 20 calls of a session are shuffled with a seeded RNG (a replay always comes after the refund
it repeats). Before timing, one pass checks that every call gets the code the mix intends.

Sessions take 64 customers in turn, each with 8 orders of its own, as in bench.api: the risk is
counted per customer, and a deployment serves many.

Refunds are judged on the money (dispatch/pipeline/allowance.py): a customer's refunds within the
policy's window, executed or held, count against its auto-approve amount, and a refund that
repeats an executed one (same order, same amount) from another session is held. So the amounts
are a counter per order, never repeated within a round, the auto-approve amount is above what a
round auto-approves in all, and a held refund's confirmation expires at once (its money stops
counting): the executed refunds stay executed, and the held ones are held for their amount alone.

Each round runs every call once, the core on a fresh state and book built outside the timing;
core and naive rounds alternate. The best round is the figure (other processes can only add
time), the median is printed beside it. The garbage collector stays on.

With `--history 2000,8000,32000` it measures instead how the cost per call grows with one
customer's history: every session (20 calls, one agent) is of the same customer, who has 500
orders, and the mix is a quarter `get_order`, a quarter refunds that execute (amounts that count
up per order, so no refund repeats another; the auto-approve amount above them all, so the
allowance holds none), a quarter float amounts and a quarter refunds in the wrong currency. Each
size runs from a fresh state, so the customer's refunds in the window grow with the calls (2,000
in the largest); the sizes and the naive loop alternate within each round, a smaller size run
again until it has made as many calls as the largest, and the figure is the median round with the
rounds' range, and the largest size's over the smallest's.

Run: `.venv/bin/python -m bench.core [--calls N] [--rounds R] [--seed S] [--json]`, or
`.venv/bin/python -m bench.core --history 2000,8000,32000 [--rounds R] [--seed S] [--json]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.pipeline import InMemoryState, Pipeline, Policy, ToolCall, ToolRegistry
from dispatch.pipeline.tools import ExecutionContext
from orders.book import InMemoryOrderBook
from orders.tools import order_tools

TARGET_US = 25.0
SESSION_CALLS = 20
AGENT = "bench-agent"
# Sessions take the customers in turn, each with orders of its own, as bench.api's do.
CUSTOMERS = tuple(f"CUS-{n + 1}" for n in range(64))
ORDERS_OF = {
    customer: tuple(f"ORD-{1001 + 8 * c + n}" for n in range(8))
    for c, customer in enumerate(CUSTOMERS)
}
# Large enough that the refunds of every round keep succeeding.
ORDER_TOTAL_CENTS = 10**13
# Above the sum of a round's executed refunds (each order's amounts 1, 2, 3, ... cents: about
# 3 * 10**7 for a round of 100,000 calls), so that none is held for what the customer already got
# (see the docstring); held refunds are above it, within the schema's largest amount (10**8).
AUTO_APPROVE_BELOW_CENTS = 5 * 10**7
MAX_AMOUNT_CENTS = 10**8

BAD_KINDS = (
    "invalid_json",
    "float_amount",
    "wrong_currency",
    "invented_order",
    "extra_field",
    "unknown_tool",
    "replay",
)
SESSION_MIX = (
    ("get_order", 8),
    ("refund_auto", 4),
    ("refund_held", 2),
    ("bad", 6),
)


@dataclass(frozen=True, slots=True)
class Call:
    kind: str
    session_id: str
    customer_id: str
    tool: str
    arguments: str
    # The result code the core must give (checked once before timing).
    expect: str


def policy() -> Policy:
    return Policy(
        version=1,
        allowed_tools=frozenset({"get_order", "refund_order"}),
        max_amount_cents=MAX_AMOUNT_CENTS,
        auto_approve_below_cents=AUTO_APPROVE_BELOW_CENTS,
        two_reviewers_from_cents=MAX_AMOUNT_CENTS,
        step_budget=1_000,
        repeat_limit=1_000,
        # A held refund's money counts in its customer's sum until its confirmation expires: here
        # at once, so that the refunds after it are judged on the executed ones alone (the mix's
        # intent); a day of it would hold every later refund of the customer.
        confirmation_ttl_seconds=0,
    )


def new_book(orders_of: Mapping[str, Sequence[str]] = ORDERS_OF) -> InMemoryOrderBook:
    book = InMemoryOrderBook()
    for customer, orders in orders_of.items():
        for order_id in orders:
            book.add(order_id, customer, ORDER_TOTAL_CENTS, "BRL")
    return book


def new_pipeline(
    orders_of: Mapping[str, Sequence[str]] = ORDERS_OF,
) -> tuple[Pipeline, InMemoryState, InMemoryOrderBook]:
    """The core as the tests build it, but with the real clock, sleep and ids."""
    book = new_book(orders_of)
    registry = ToolRegistry()
    for spec in order_tools(book):
        registry.register(spec)
    state = InMemoryState()
    return Pipeline(registry, state), state, book


def _args(**values: Any) -> str:
    return json.dumps(values)


def make_calls(count: int, seed: int) -> list[Call]:
    """`count` calls (rounded up to whole sessions) in the mix described at the top."""
    rng = random.Random(seed)
    calls: list[Call] = []
    bad_turn = 0
    refunds_of: Counter[str] = Counter()
    sessions = -(-count // SESSION_CALLS)
    for number in range(sessions):
        session_id = f"bench-{number}"
        customer = CUSTOMERS[number % len(CUSTOMERS)]
        kinds = [kind for kind, times in SESSION_MIX for _ in range(times)]
        for position, kind in enumerate(kinds):
            if kind == "bad":
                kinds[position] = BAD_KINDS[bad_turn % len(BAD_KINDS)]
                bad_turn += 1
        rng.shuffle(kinds)
        if "replay" in kinds:
            # The refund it repeats must come first.
            replay, first = kinds.index("replay"), kinds.index("refund_auto")
            if first > replay:
                kinds[first], kinds[replay] = kinds[replay], kinds[first]
        last_refund: str | None = None
        for kind in kinds:
            order_id = rng.choice(ORDERS_OF[customer])
            tool, expect = "refund_order", "OK"
            if kind == "get_order":
                tool, arguments = "get_order", _args(order_id=order_id)
            elif kind in ("refund_auto", "refund_held"):
                # A counter per order: no refund repeats another's order and amount in a round.
                refunds_of[order_id] += 1
                cents = refunds_of[order_id]
                if kind == "refund_held":
                    cents += AUTO_APPROVE_BELOW_CENTS
                    expect = "CONFIRMATION_REQUIRED"
                arguments = _args(
                    order_id=order_id, amount_cents=cents, currency="BRL", reason="damaged"
                )
                if kind == "refund_auto":
                    last_refund = arguments
            elif kind == "invalid_json":
                # Cut off mid-object, as a model that ran out of tokens leaves it.
                arguments = '{"order_id": "' + order_id + '", "amount_cents": 12'
                expect = "INVALID_JSON"
            elif kind == "float_amount":
                arguments = _args(
                    order_id=order_id, amount_cents=25.9, currency="BRL", reason="damaged"
                )
                expect = "INVALID_ARGUMENTS"
            elif kind == "wrong_currency":
                arguments = _args(
                    order_id=order_id, amount_cents=990, currency="USD", reason="damaged"
                )
                expect = "CURRENCY_MISMATCH"
            elif kind == "invented_order":
                tool, arguments = "get_order", _args(order_id="ORD-99999")
                expect = "ORDER_NOT_FOUND"
            elif kind == "extra_field":
                tool, arguments = "get_order", _args(order_id=order_id, include="history")
                expect = "INVALID_ARGUMENTS"
            elif kind == "unknown_tool":
                tool, arguments = "teleport_order", _args(order_id=order_id)
                expect = "UNKNOWN_TOOL"
            elif kind == "replay":
                assert last_refund is not None
                arguments = last_refund
            else:  # pragma: no cover - the mix above is closed
                raise AssertionError(kind)
            calls.append(Call(kind, session_id, customer, tool, arguments, expect))
    return calls


def tool_calls(calls: Sequence[Call]) -> list[ToolCall]:
    return [ToolCall(AGENT, c.session_id, c.customer_id, c.tool, c.arguments) for c in calls]


def verify(
    calls: Sequence[Call],
    orders_of: Mapping[str, Sequence[str]] = ORDERS_OF,
    rules: Policy | None = None,
) -> tuple[Counter[str], int]:
    """One untimed pass on a fresh core: every call must get the code the mix intends.

    Returns the codes and how many refunds took effect.
    """
    pipeline, state, book = new_pipeline(orders_of)
    rules = rules or policy()
    codes: Counter[str] = Counter()
    for call, tool_call in zip(calls, tool_calls(calls), strict=True):
        result = pipeline.run(tool_call, rules)
        replayed = call.kind == "replay"
        if result.code != call.expect or result.replayed != replayed:
            raise SystemExit(
                f"bench/core.py: {call.kind} got {result.code} (replayed={result.replayed}), "
                f"expected {call.expect}: {result.message}"
            )
        codes[result.code + (" (replayed)" if result.replayed else "")] += 1
    if len(state.audit) != len(calls):
        raise SystemExit("bench/core.py: the audit does not hold one record per call")
    return codes, len(book.receipts)


def time_core(
    calls: Sequence[Call],
    orders_of: Mapping[str, Sequence[str]] = ORDERS_OF,
    rules: Policy | None = None,
) -> float:
    """Seconds to run every call through a fresh core (built outside the timing)."""
    pipeline, _, _ = new_pipeline(orders_of)
    run, rules = pipeline.run, rules or policy()
    batch = tool_calls(calls)
    gc.collect()
    started = time.perf_counter()
    for tool_call in batch:
        run(tool_call, rules)
    return time.perf_counter() - started


def time_naive(
    calls: Sequence[Call], orders_of: Mapping[str, Sequence[str]] = ORDERS_OF
) -> tuple[float, int, int]:
    """Seconds for the naive loop on the same calls, how many crashed it, and refunds made."""
    book = new_book(orders_of)
    handlers = {spec.name: (spec.handler, spec.arguments) for spec in order_tools(book)}
    batch = [(c.tool, c.arguments, c.customer_id) for c in calls]
    crashed = 0
    loads = json.loads
    gc.collect()
    started = time.perf_counter()
    for number, (tool, raw, customer) in enumerate(batch):
        try:
            handler, model = handlers[tool]
            # No checks at all: the parsed values go to the handler as they are.
            handler(model.model_construct(**loads(raw)), ExecutionContext(customer, f"n{number}"))
        except Exception:
            crashed += 1
    return time.perf_counter() - started, crashed, len(book.receipts)


def _figures(seconds: Sequence[float], count: int) -> dict[str, Any]:
    best, median = min(seconds), statistics.median(seconds)
    return {
        "us_per_call": best / count * 1e6,
        "calls_per_s": count / best,
        "median_us_per_call": median / count * 1e6,
        "median_calls_per_s": count / median,
        "rounds_us_per_call": [round(s / count * 1e6, 3) for s in seconds],
    }


def measure(count: int, rounds: int, seed: int) -> dict[str, Any]:
    calls = make_calls(count, seed)
    codes, core_refunds = verify(calls)  # also the core's warm-up
    time_naive(calls)  # the naive loop's warm-up
    core_s: list[float] = []
    naive_s: list[float] = []
    crashed = naive_refunds = 0
    for _ in range(rounds):
        # Alternated, so that a change in the machine's load hits both alike.
        core_s.append(time_core(calls))
        seconds, crashed, naive_refunds = time_naive(calls)
        naive_s.append(seconds)
    core, naive = _figures(core_s, len(calls)), _figures(naive_s, len(calls))
    return {
        "benchmark": "core",
        "calls": len(calls),
        "rounds": rounds,
        "seed": seed,
        "statistic": "best of rounds (median also given)",
        "mix": dict(Counter(c.kind for c in calls)),
        "core": {**core, "codes": dict(codes), "refunds_executed": core_refunds},
        "naive": {**naive, "crashed_calls": crashed, "refunds_executed": naive_refunds},
        "ratio": core["us_per_call"] / naive["us_per_call"],
        "median_ratio": core["median_us_per_call"] / naive["median_us_per_call"],
        "target_us_per_call": TARGET_US,
        "target_met": core["us_per_call"] < TARGET_US,
        "python": python_build(),
        "machine": f"{platform.machine()}, {_cpus()} CPUs",
        "gc": "enabled",
    }


# One customer's history (--history) ------------------------------------------------------------

HISTORY_SIZES = (2_000, 8_000, 32_000)
HISTORY_ROUNDS = 5
HISTORY_TARGET_RATIO = 1.2
HISTORY_CUSTOMER = "CUS-H"
HISTORY_ORDERS_OF = {HISTORY_CUSTOMER: tuple(f"ORD-{5001 + n}" for n in range(500))}
HISTORY_MIX = (("get_order", 5), ("refund_auto", 5), ("float_amount", 5), ("wrong_currency", 5))
# Refunds of 1.01 BRL and up, counting up per order: 32,000 calls make 8,000 refunds of under
# 10,000 BRL in all, so the customer's sum, the agent's day and every amount stay below the
# policy's lines and the allowance lets each through after reading the whole window.
HISTORY_LINE_CENTS = 10**11


def history_policy() -> Policy:
    return Policy(
        version=1,
        allowed_tools=frozenset({"get_order", "refund_order"}),
        max_amount_cents=MAX_AMOUNT_CENTS,
        auto_approve_below_cents=HISTORY_LINE_CENTS,
        daily_cap_cents=HISTORY_LINE_CENTS,
        two_reviewers_from_cents=HISTORY_LINE_CENTS,
        step_budget=1_000,
        repeat_limit=1_000,
    )


def make_history_calls(count: int, seed: int) -> list[Call]:
    """`count` calls (rounded up to whole sessions), every session of the one customer."""
    rng = random.Random(seed)
    orders = HISTORY_ORDERS_OF[HISTORY_CUSTOMER]
    refunds_of: Counter[str] = Counter()
    calls: list[Call] = []
    for number in range(-(-count // SESSION_CALLS)):
        session_id = f"history-{number}"
        kinds = [kind for kind, times in HISTORY_MIX for _ in range(times)]
        rng.shuffle(kinds)
        for kind in kinds:
            order_id = rng.choice(orders)
            tool, expect = "refund_order", "OK"
            if kind == "get_order":
                tool, arguments = "get_order", _args(order_id=order_id)
            elif kind == "refund_auto":
                refunds_of[order_id] += 1
                arguments = _args(
                    order_id=order_id,
                    amount_cents=100 + refunds_of[order_id],
                    currency="BRL",
                    reason="damaged",
                )
            elif kind == "float_amount":
                arguments = _args(
                    order_id=order_id, amount_cents=25.9, currency="BRL", reason="damaged"
                )
                expect = "INVALID_ARGUMENTS"
            else:
                arguments = _args(
                    order_id=order_id, amount_cents=990, currency="USD", reason="damaged"
                )
                expect = "CURRENCY_MISMATCH"
            calls.append(Call(kind, session_id, HISTORY_CUSTOMER, tool, arguments, expect))
    return calls


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def measure_history(sizes: Sequence[int], rounds: int, seed: int) -> dict[str, Any]:
    sizes = sorted(
        {max(SESSION_CALLS, -(-size // SESSION_CALLS) * SESSION_CALLS) for size in sizes}
    )
    every = make_history_calls(sizes[-1], seed)
    rules = history_policy()
    outcomes: dict[int, dict[str, Any]] = {}
    for size in sizes:
        # Also the warm-up of both sides.
        codes, refunds = verify(every[:size], HISTORY_ORDERS_OF, rules)
        time_naive(every[:size], HISTORY_ORDERS_OF)
        outcomes[size] = {"codes": dict(codes), "refunds_executed": refunds}
    core_us: dict[int, list[float]] = {size: [] for size in sizes}
    naive_us: dict[int, list[float]] = {size: [] for size in sizes}
    for number in range(rounds):
        # Each round begins with the next size, so that no size always runs first; core and naive
        # alternate within it, so that a change in the machine's load hits both alike. A smaller
        # size runs as many times as it takes to make as many calls as the largest: each size's
        # figure spans about as long a stretch of the machine's load.
        for size in sizes[number % len(sizes) :] + sizes[: number % len(sizes)]:
            calls, times = every[:size], max(1, sizes[-1] // size)
            core_s = naive_s = 0.0
            for _ in range(times):
                core_s += time_core(calls, HISTORY_ORDERS_OF, rules)
                naive_s += time_naive(calls, HISTORY_ORDERS_OF)[0]
            core_us[size].append(core_s / (size * times) * 1e6)
            naive_us[size].append(naive_s / (size * times) * 1e6)
    smallest, largest = sizes[0], sizes[-1]
    per_round = [
        big / small for big, small in zip(core_us[largest], core_us[smallest], strict=True)
    ]
    growth = statistics.median(core_us[largest]) / statistics.median(core_us[smallest])
    return {
        "benchmark": "core-history",
        "sizes": sizes,
        "rounds": rounds,
        "seed": seed,
        "statistic": "median of interleaved rounds (min and max also given)",
        "customer_orders": len(HISTORY_ORDERS_OF[HISTORY_CUSTOMER]),
        "mix": dict(Counter(c.kind for c in every)),
        "by_size": {
            size: {
                "core_us_per_call": _spread(core_us[size]),
                "naive_us_per_call": _spread(naive_us[size]),
                "ratio": statistics.median(core_us[size]) / statistics.median(naive_us[size]),
                "core_rounds_us_per_call": [round(us, 2) for us in core_us[size]],
                **outcomes[size],
            }
            for size in sizes
        },
        "growth": growth,
        "growth_by_round": _spread(per_round),
        "target_growth": HISTORY_TARGET_RATIO,
        "target_met": growth <= HISTORY_TARGET_RATIO,
        "python": python_build(),
        "machine": f"{platform.machine()}, {_cpus()} CPUs",
        "gc": "enabled",
    }


def render_history(result: Mapping[str, Any]) -> str:
    def spread(figures: Mapping[str, float]) -> str:
        return f"{figures['median']:>7.1f} ({figures['min']:.1f}-{figures['max']:.1f})"

    lines = [
        f"(a) core in-process, one customer's history: {result['customer_orders']} orders, "
        f"median of {result['rounds']} interleaved rounds (Python {result['python']}, "
        f"{result['machine']})",
        f"  {'calls':>7}  {'core us/call (range)':>24}  {'naive us/call (range)':>24}  ratio",
    ]
    for size, figures in result["by_size"].items():
        lines.append(
            f"  {size:>7,}  {spread(figures['core_us_per_call']):>24}  "
            f"{spread(figures['naive_us_per_call']):>24}  {figures['ratio']:4.1f}x"
        )
    sizes = result["sizes"]
    verdict = "met" if result["target_met"] else "NOT met"
    growth = result["growth_by_round"]
    lines.append(
        f"  core's time per call at {sizes[-1]:,} over {sizes[0]:,}: {result['growth']:.2f}x "
        f"(round by round {growth['min']:.2f}-{growth['max']:.2f}x); "
        f"target <= {result['target_growth']:.1f}x: {verdict}"
    )
    for size, figures in result["by_size"].items():
        codes = ", ".join(f"{code} {n}" for code, n in sorted(figures["codes"].items()))
        lines.append(
            f"  {size:>7,} calls: {codes}; refunds executed {figures['refunds_executed']}, "
            f"held {figures['codes'].get('CONFIRMATION_REQUIRED', 0)}"
        )
    return "\n".join(lines)


def python_build() -> str:
    """The interpreter, as far as its speed goes: version, where it lives, how libpython is linked.

    A build with a shared libpython and no profile-guided optimisation (pyenv's default) runs the
    same Python code markedly slower than a distribution's static, optimised one.
    """
    try:
        # What this process has mapped: a distribution may build libpython shared and yet link
        # its interpreter statically, as Debian does.
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            shared = "libpython" in maps.read()
    except OSError:
        shared = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
    linked = "shared" if shared else "static"
    return f"{platform.python_version()} from {sys.base_prefix}, {linked} libpython"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def render(result: Mapping[str, Any]) -> str:
    core, naive = result["core"], result["naive"]

    def row(name: str, figures: Mapping[str, Any]) -> str:
        return (
            f"  {name:26}{figures['calls_per_s']:>10,.0f}{figures['us_per_call']:>9.2f}"
            f"{figures['median_us_per_call']:>10.2f}"
        )

    verdict = "met" if result["target_met"] else "NOT met"
    return "\n".join(
        [
            f"(a) core in-process: {result['calls']} calls, best of {result['rounds']} rounds "
            f"(Python {result['python']}, {result['machine']})",
            f"  {'':26}{'calls/s':>10}{'us/call':>9}{'median':>10}",
            row("core  Pipeline.run", core),
            row("naive loads + handler", naive),
            f"  ratio core/naive time: {result['ratio']:.1f}x "
            f"(median {result['median_ratio']:.1f}x); "
            f"target < {result['target_us_per_call']:.0f} us/call: {verdict}",
            "  core outcomes: "
            + ", ".join(f"{code} {n}" for code, n in sorted(core["codes"].items())),
            f"  refunds executed: core {core['refunds_executed']}, "
            f"naive {naive['refunds_executed']}; "
            f"the naive loop crashed on {naive['crashed_calls']} calls",
        ]
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.core", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000, help="calls per round")
    parser.add_argument(
        "--rounds", type=int, help="timed rounds of each side (20; with --history, 5)"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--history",
        metavar="SIZES",
        help="one customer's history instead: calls per run, e.g. 2000,8000,32000",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="print nothing, return the results")
    options = parser.parse_args(argv)
    if options.history:
        try:
            sizes = [int(size) for size in options.history.split(",")]
        except ValueError:
            parser.error(f"--history: not a list of numbers: {options.history!r}")
        rounds = max(options.rounds or HISTORY_ROUNDS, 1)
        result = measure_history(sizes, rounds, options.seed)
        text = render_history(result)
    else:
        rounds = max(options.rounds or 20, 1)
        result = measure(max(options.calls, SESSION_CALLS), rounds, options.seed)
        text = render(result)
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

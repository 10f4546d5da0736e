"""The result contract, the code catalogue and the pipeline's refusal to raise."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.pipeline import ToolRegistry
from dispatch.pipeline.codes import CORE_CODES, CodeCatalogue
from orders.book import InMemoryOrderBook
from orders.tools import order_tools
from tests.dispatch.pipeline.conftest import Harness, build_harness

RESULT_FIELDS = {
    "call_id",
    "ok",
    "tool",
    "code",
    "message",
    "data",
    "replayed",
    "retryable",
    "model_text",
}


def test_every_result_has_the_same_shape(harness: Harness) -> None:
    outcomes = [
        harness.call("get_order", '{"order_id": "ORD-1001"}'),
        harness.call("x", "{}"),
        harness.refund(arguments={"amount_cents": 1.5}),
        harness.refund(8000),
    ]
    for outcome in outcomes:
        assert set(outcome.as_dict()) == RESULT_FIELDS
        json.dumps(outcome.as_dict())


def test_model_text_tells_the_model_what_to_do(harness: Harness) -> None:
    ok = harness.call("get_order", '{"order_id": "ORD-1001"}')
    fixable = harness.refund(arguments={"amount_cents": 1.5})
    held = harness.refund(8000)

    # Compact JSON of the data, in the order the tool gave it: its id first.
    assert ok.model_text == (
        'OK get_order: {"order_id":"ORD-1001","total_cents":12000,"currency":"BRL",'
        '"refunded_cents":0,"refundable_cents":12000}'
    )
    assert json.loads(ok.model_text.removeprefix("OK get_order: ")) == ok.data
    assert fixable.model_text.startswith("ERROR INVALID_ARGUMENTS refund_order: amount_cents")
    assert fixable.model_text.endswith("Correct the call and send it again, or ask the user.")
    assert held.model_text.startswith("PENDING refund_order: held for human approval")


def test_the_catalogue_holds_core_and_domain_codes_ordered_by_stage() -> None:
    registry = ToolRegistry()
    for spec in order_tools(InMemoryOrderBook()):
        registry.register(spec)

    names = [code.name for code in registry.catalogue]
    stages = [code.stage for code in registry.catalogue]

    assert {"ORDER_NOT_FOUND", "CURRENCY_MISMATCH", "AMOUNT_EXCEEDS_REFUNDABLE"} <= set(names)
    assert {code.name for code in CORE_CODES} <= set(names)
    assert stages == sorted(stages)
    assert "INVALID_ARGUMENTS" in registry.catalogue.model_fixable()
    assert "STEP_LIMIT" not in registry.catalogue.model_fixable()


def test_a_code_declared_twice_differently_is_refused() -> None:
    (first,) = [c for c in CORE_CODES if c.name == "OK"]
    from dataclasses import replace

    try:
        CodeCatalogue([first, replace(first, meaning="other")])
    except ValueError as exc:
        assert "OK" in str(exc)
    else:
        raise AssertionError("a conflicting code was accepted")


def test_a_tool_cannot_be_registered_twice() -> None:
    registry = ToolRegistry()
    get_order, *_ = order_tools(InMemoryOrderBook())
    registry.register(get_order)
    try:
        registry.register(get_order)
    except ValueError:
        pass
    else:
        raise AssertionError("a duplicate tool was accepted")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.text(max_size=300), json_values.map(json.dumps)))
def test_no_raw_text_makes_it_raise_or_refund_unless_it_is_a_valid_call(raw: str) -> None:
    harness = build_harness()
    result = harness.call("refund_order", raw)

    assert set(result.as_dict()) == RESULT_FIELDS
    assert result.code in harness.pipeline.registry.catalogue
    assert harness.ledger_rows == (1 if result.ok else 0)
    assert len(harness.state.audit) == 1


@settings(max_examples=200, deadline=None)
@given(
    amount=st.integers(min_value=-(10**15), max_value=10**15)
    | st.floats(allow_nan=True, allow_infinity=True),
    currency=st.sampled_from(["BRL", "USD", "EUR", "brl", "", "R$"]),
    order_id=st.sampled_from(["ORD-1001", "ORD-1002", "ORD-1001 ", "ord-1001", "ORD-01001"]),
)
def test_refunds_never_exceed_the_order_total(amount: object, currency: str, order_id: str) -> None:
    harness = build_harness()
    arguments = {"order_id": order_id, "currency": currency, "reason": "damaged"}
    for _ in range(3):
        harness.call("refund_order", {**arguments, "amount_cents": amount})
    for order in harness.book.orders.values():
        assert 0 <= order.refunded_cents <= order.total_cents
    assert sum(r.amount_cents for r in harness.book.receipts.values()) == harness.refunded_cents()

"""Tool versions side by side, and retirement: the registry's rules and stage 1, in the core."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from dispatch.pipeline import ToolRegistry, ToolSpec
from dispatch.pipeline.engine import Refusal, recheck
from dispatch.pipeline.tools import ExecutionContext, VersionError, check_versions
from dispatch.pipeline.what_if import AUTO_EXECUTED, ONE_REVIEWER, PastCall, what_if_of
from tests.dispatch.pipeline.conftest import Harness, default_policy

BOTH = frozenset({"get_order", "refund_order", "refund_order_v2"})
V2_REFUND = {
    "order_id": "ORD-1001",
    "amount_cents": 1000,
    "currency": "BRL",
    "reason_code": "goodwill",
}


class _Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _noop(arguments: _Nothing, context: ExecutionContext) -> dict[str, Any]:
    return {}


def tool(name: str, *, replaces: str | None = None, retired: bool = False) -> ToolSpec[Any]:
    return ToolSpec(
        name=name,
        description=name,
        arguments=_Nothing,
        handler=_noop,
        replaces=replaces,
        retired=retired,
    )


def registry_of(*specs: ToolSpec[Any]) -> ToolRegistry:
    registry = ToolRegistry()
    for spec in specs:
        registry.register(spec)
    return registry


# The registry's rules ------------------------------------------------------------------------


def test_it_refuses_a_replacement_of_an_unknown_tool() -> None:
    registry = registry_of(tool("refund_order_v2", replaces="refund_ordr"))

    with pytest.raises(VersionError, match="replaces 'refund_ordr', which is not a registered"):
        registry.check_versions()


def test_it_refuses_replacements_that_go_round_in_a_cycle() -> None:
    specs = (tool("a", replaces="c"), tool("b", replaces="a"), tool("c", replaces="b"))

    with pytest.raises(VersionError, match="cycle"):
        check_versions(specs)


def test_it_refuses_two_successors_of_one_tool() -> None:
    specs = (tool("a"), tool("a_v2", replaces="a"), tool("a_new", replaces="a"))

    with pytest.raises(VersionError, match="already replaces"):
        check_versions(specs)


def test_a_tool_cannot_replace_itself() -> None:
    with pytest.raises(ValueError, match="cannot replace itself"):
        tool("a", replaces="a")


def test_a_line_of_versions_holds_together() -> None:
    registry = registry_of(tool("a"), tool("a_v2", replaces="a"), tool("a_v3", replaces="a_v2"))

    registry.check_versions()
    assert registry.replaced_by("a") == "a_v2"
    assert registry.replaced_by("a_v3") is None


def test_the_successor_is_the_newest_version_not_retired() -> None:
    registry = registry_of(
        tool("a", retired=True),
        tool("a_v2", replaces="a", retired=True),
        tool("a_v3", replaces="a_v2"),
        tool("b", retired=True),
    )

    assert registry.successor_of("a") == "a_v3"
    assert registry.successor_of("a_v2") == "a_v3"
    assert registry.successor_of("a_v3") is None
    assert registry.successor_of("b") is None


def test_a_retired_tool_is_not_listed_but_stays_registered() -> None:
    registry = registry_of(tool("a"), tool("a_v2", replaces="a"))

    registry.set_retired("a")

    assert [spec.name for spec in registry.listed()] == ["a_v2"]
    assert [spec.name for spec in registry] == ["a", "a_v2"]
    assert registry.get("a") is not None and registry.get("a").retired  # type: ignore[union-attr]
    registry.set_retired("a", retired=False)
    assert [spec.name for spec in registry.listed()] == ["a", "a_v2"]


def test_retiring_an_unknown_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="no tool of that name"):
        registry_of(tool("a")).set_retired("b")


# Stage 1 on the order tools ------------------------------------------------------------------


def test_both_versions_of_the_refund_execute_side_by_side(harness: Harness) -> None:
    policy = default_policy(allowed_tools=BOTH)

    v1 = harness.refund(1000, policy=policy)
    v2 = harness.call("refund_order_v2", json.dumps(V2_REFUND), policy=policy)

    assert (v1.code, v1.tool, v2.code, v2.tool) == ("OK", "refund_order", "OK", "refund_order_v2")
    assert harness.ledger_rows == 2
    assert harness.refunded_cents() == 2000


def test_v2_holds_its_own_contract(harness: Harness) -> None:
    policy = default_policy(allowed_tools=BOTH)
    v1_style = {**V2_REFUND, "reason": "customer_request"}
    del v1_style["reason_code"]

    result = harness.call("refund_order_v2", json.dumps(v1_style), policy=policy)

    assert result.code == "INVALID_ARGUMENTS"
    assert "reason_code" in result.message
    assert harness.ledger_rows == 0


def test_v2_is_allowed_on_its_own_allowlist_entry(harness: Harness) -> None:
    result = harness.call("refund_order_v2", json.dumps(V2_REFUND))

    assert result.code == "TOOL_NOT_ALLOWED"
    assert harness.ledger_rows == 0


def test_a_call_to_a_retired_tool_is_refused_naming_its_successor(harness: Harness) -> None:
    harness.pipeline.registry.set_retired("refund_order")
    policy = default_policy(allowed_tools=BOTH)

    result = harness.refund(1000, policy=policy)

    assert result.code == "TOOL_RETIRED"
    assert not result.retryable
    assert result.data == {"successor": "refund_order_v2", "successor_allowed": True}
    assert "call refund_order_v2 instead" in result.message
    assert "refund_order_v2" in result.model_text
    assert harness.ledger_rows == 0
    # One audit record, which claimed no key: nothing was judged past stage 1.
    audit = harness.state.audit[-1]
    assert (audit.code, audit.key) == ("TOOL_RETIRED", None)


def test_a_retired_tool_whose_successor_is_not_allowed_says_so(harness: Harness) -> None:
    harness.pipeline.registry.set_retired("refund_order")

    result = harness.refund(1000)

    assert result.code == "TOOL_RETIRED"
    assert result.data == {"successor": "refund_order_v2", "successor_allowed": False}
    assert "not allowed for this agent" in result.message
    assert harness.ledger_rows == 0


def test_a_retired_tool_off_the_allowlist_is_just_not_allowed(harness: Harness) -> None:
    harness.pipeline.registry.set_retired("refund_order")
    policy = default_policy(allowed_tools=frozenset({"get_order"}))

    assert harness.refund(1000, policy=policy).code == "TOOL_NOT_ALLOWED"


def test_a_retired_tool_is_not_offered_when_a_name_is_unknown(harness: Harness) -> None:
    harness.pipeline.registry.set_retired("refund_order")
    policy = default_policy(allowed_tools=BOTH)

    result = harness.call("refund", "{}", policy=policy)

    assert result.code == "UNKNOWN_TOOL"
    assert "get_order, refund_order_v2)" in result.message


def test_a_held_call_of_a_retired_tool_is_still_judged_by_its_own_rules(harness: Harness) -> None:
    policy = default_policy(allowed_tools=BOTH)
    held = harness.refund(9000, policy=policy)
    assert held.code == "CONFIRMATION_REQUIRED"
    harness.pipeline.registry.set_retired("refund_order")
    arguments = {"order_id": "ORD-1001", "amount_cents": 9000, "currency": "BRL"}

    judged = recheck(
        harness.pipeline.registry,
        policy,
        tool="refund_order",
        arguments={**arguments, "reason": "damaged"},
        customer_id="CUS-1",
    )
    too_much = recheck(
        harness.pipeline.registry,
        policy,
        tool="refund_order",
        arguments={**arguments, "amount_cents": 20_000, "reason": "damaged"},
        customer_id="CUS-1",
    )

    assert not isinstance(judged, Refusal) and judged[0].name == "refund_order"
    assert isinstance(too_much, Refusal) and too_much.code.name == "AMOUNT_EXCEEDS_REFUNDABLE"


def test_a_retired_declaration_is_refused_the_same_way(harness: Harness) -> None:
    registry = ToolRegistry()
    for spec in harness.pipeline.registry:
        registry.register(replace(spec, retired=spec.name == "refund_order"))
    harness.pipeline.registry = registry

    result = harness.refund(1000, policy=default_policy(allowed_tools=BOTH))

    assert result.code == "TOOL_RETIRED"
    assert registry.successor_of("refund_order") == "refund_order_v2"


def test_the_lines_of_versions_are_listed_oldest_first() -> None:
    registry = registry_of(
        tool("b_v2", replaces="b"),
        tool("a_v2", replaces="a"),
        tool("a"),
        tool("b"),
        tool("c"),
        tool("a_v3", replaces="a_v2"),
    )

    lines = [[spec.name for spec in line] for line in registry.version_lines()]

    assert lines == [["a", "a_v2", "a_v3"], ["b", "b_v2"]]


# The what-if, each version apart -------------------------------------------------------------


def test_the_what_if_counts_each_version_apart_on_the_customers_one_sum() -> None:
    start = datetime(2026, 1, 1, 12, tzinfo=UTC)

    def past(minute: int, tool: str, amount: int, outcome: str) -> PastCall:
        at = start + timedelta(minutes=minute)
        return PastCall(
            at,
            "agent-1",
            "s-1",
            "CUS-1",
            tool,
            f"ORD-{minute}",
            "BRL",
            amount,
            outcome,
            call_id=f"call-{minute}",
        )

    calls = [
        past(0, "refund_order", 3_000, AUTO_EXECUTED),
        past(1, "refund_order_v2", 1_500, AUTO_EXECUTED),
        past(2, "refund_order_v2", 6_000, ONE_REVIEWER),
    ]

    result = what_if_of(default_policy(allowed_tools=BOTH, auto_approve_below_cents=4_000), calls)

    v1, v2 = result.by_tool["refund_order"], result.by_tool["refund_order_v2"]
    assert (v1.actual[AUTO_EXECUTED].calls, v1.draft[AUTO_EXECUTED].calls) == (1, 1)
    # v2's 1500 comes after v1's 3000 for the same customer: 4500, not below 4000.
    assert (v2.actual[AUTO_EXECUTED].calls, v2.draft[AUTO_EXECUTED].calls) == (1, 0)
    assert (v2.actual[ONE_REVIEWER].calls, v2.draft[ONE_REVIEWER].calls) == (1, 2)
    assert v2.draft[ONE_REVIEWER].cents == {"BRL": 7_500}
    assert list(result.by_tool) == ["refund_order", "refund_order_v2"]

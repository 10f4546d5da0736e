"""A reviewer's edit, judged by the core alone: the tool's declared rules, then the pipeline's own
stages on the edited call."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.edits import EditedCall, EditRefused, edit_judge, edit_refusal
from dispatch.pipeline.tools import Editable, EditRule, ToolSpec
from tests.dispatch.pipeline.conftest import Harness

ASKED = {"order_id": "ORD-1001", "amount_cents": 8_000, "currency": "BRL", "reason": "damaged"}


class ReturnArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    order_id: str
    item_ids: list[str] = Field(min_length=1)


RETURN = ToolSpec(
    name="return_items",
    description="",
    arguments=ReturnArguments,
    handler=lambda arguments, context: {},
    subject_field="order_id",
    editable=(Editable("item_ids", EditRule.ONLY_FEWER),),
)


def judge(harness: Harness, changes: dict[str, Any]) -> EditedCall | EditRefused:
    return edit_judge(
        harness.pipeline.registry,
        harness.policy,
        tool="refund_order",
        asked=ASKED,
        changes=changes,
        customer_id="CUS-1",
        asked_amount_cents=8_000,
    )


def test_a_lower_amount_passes_with_its_money_and_what_changed(harness: Harness) -> None:
    edited = judge(harness, {"amount_cents": 6_000})

    assert isinstance(edited, EditedCall)
    assert edited.arguments == {**ASKED, "amount_cents": 6_000}
    assert edited.changed == {"amount_cents": (8_000, 6_000)}
    assert edited.money is not None and edited.money.amount_cents == 6_000


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"amount_cents": 8_001}, "is more than the 8000 asked"),
        ({"order_id": "ORD-2003"}, "order_id cannot be changed"),
        ({"amount_cents": True}, "give a whole number"),
        ({"amount_cents": -5}, "does not fit its schema"),
        ({"amount_cents": 8_000}, "Nothing was changed"),
    ],
)
def test_an_edit_outside_the_rules_is_refused_in_words(
    harness: Harness, changes: dict[str, Any], words: str
) -> None:
    refused = judge(harness, changes)

    assert isinstance(refused, EditRefused)
    assert words in refused.message


def test_an_edit_of_a_call_that_no_longer_passes_its_check_is_refused(harness: Harness) -> None:
    harness.book.orders["ORD-1001"] = harness.book.orders["ORD-1001"]._replace(
        refunded_cents=11_000
    )

    refused = judge(harness, {"amount_cents": 6_000})

    assert isinstance(refused, EditRefused)
    assert "does not pass its checks" in refused.message


def test_a_list_may_only_lose_entries() -> None:
    asked = {"order_id": "O-1", "item_ids": ["a", "b", "b"]}

    assert edit_refusal(RETURN, asked, {"item_ids": ["b", "a"]}) is None
    assert edit_refusal(RETURN, asked, {"item_ids": ["a", "b", "b"]}) == EditRefused(
        "Nothing was changed: approve it as asked, or change what may change."
    )
    more = edit_refusal(RETURN, asked, {"item_ids": ["a", "a"]})
    other = edit_refusal(RETURN, asked, {"item_ids": ["c"]})
    assert more is not None and "a was not asked (or not as often)" in more.message
    assert other is not None and "c was not asked" in other.message


def test_a_tool_cannot_declare_its_subject_or_an_unknown_argument_editable() -> None:
    with pytest.raises(ValueError, match="subject"):
        ToolSpec(
            name="t",
            description="",
            arguments=ReturnArguments,
            handler=lambda arguments, context: {},
            subject_field="order_id",
            editable=(Editable("order_id", EditRule.ONLY_FEWER),),
        )
    with pytest.raises(ValueError, match="not an argument"):
        ToolSpec(
            name="t",
            description="",
            arguments=ReturnArguments,
            handler=lambda arguments, context: {},
            editable=(Editable("amount", EditRule.ONLY_LOWER),),
        )

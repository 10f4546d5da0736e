"""Every page, table and message writes an amount through dispatch.money.money."""

from __future__ import annotations

import pytest

from dispatch.money import money


@pytest.mark.parametrize(
    ("amount_cents", "currency", "shown"),
    [
        (2590, "BRL", "R$\xa025,90"),
        (2590, "usd", "$25.90"),
        (500, "JPY", "¥500"),
        (1250, "KWD", "KWD\xa01.250"),
    ],
)
def test_it_writes_an_amount_in_its_currencys_own_format(
    amount_cents: int, currency: str, shown: str
) -> None:
    assert money(amount_cents, currency) == shown


def test_an_amount_of_no_known_currency_is_its_bare_number() -> None:
    assert money(2590, "") == "2590"
    assert money(2590, None) == "2590"


def test_no_amount_is_written_as_nothing() -> None:
    assert money(None, "USD") == ""

"""Amounts of money as people write them and as Toolgate keeps them.

Toolgate keeps amounts in each currency's minor units, with the currency's own exponent (BRL, USD
and EUR 2, JPY 0, KWD 3: Babel knows them), and people enter and read them in major units:
50.00 BRL is kept as 5000, ¥5000 as 5000, 5.000 KWD as 5000.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from babel.numbers import format_currency, get_currency_precision

# One locale per currency, whoever reads the page: R$ 25,90, $25.90, 25,90 €, ¥5,000.
CURRENCY_LOCALES = {"BRL": "pt_BR", "USD": "en_US", "EUR": "de_DE", "JPY": "en_US"}
FALLBACK_LOCALE = "en_US"
# Any other currency: its code, a space, and its own number of decimals (KWD 1.250).
FALLBACK_FORMAT = "¤\xa0#,##0.###"


class AmountInvalid(ValueError):
    """An amount that is not one of the currency: not a number, negative, or finer than its
    minor unit."""


def exponent(currency: str) -> int:
    """How many decimals the currency's minor unit has."""
    return int(get_currency_precision(currency.upper()))


def minor_units(amount: str | Decimal, currency: str) -> int:
    """An amount in major units ("50", "50.5", Decimal("1.250")) in the currency's minor units."""
    try:
        value = Decimal(str(amount).strip())
    except InvalidOperation:
        raise AmountInvalid(f"{amount!r} is not an amount") from None
    if not value.is_finite() or value < 0:
        raise AmountInvalid(f"{amount} is not an amount of money (0 or more)")
    minor = value.scaleb(exponent(currency))
    if minor != minor.to_integral_value():
        places = exponent(currency)
        raise AmountInvalid(
            f"{amount} {currency.upper()} is finer than its smallest unit "
            f"({places} decimal{'s' if places != 1 else ''})"
        )
    return int(minor)


def major_units(amount_cents: int, currency: str) -> str:
    """An amount in minor units as a plain number in major units: 5000 BRL is "50.00"."""
    places = exponent(currency)
    return f"{Decimal(amount_cents).scaleb(-places):.{places}f}"


def money(amount_cents: int | None, currency: str | None) -> str:
    """An amount in minor units (2590) in its currency's own format (R$ 25,90): the one way every
    page, table and message writes an amount. No amount is ""; an amount of no known currency
    is its bare number (a tool that declares an amount but no currency)."""
    if amount_cents is None:
        return ""
    if not currency:
        return str(amount_cents)
    code = currency.upper()
    amount = Decimal(amount_cents).scaleb(-exponent(code))
    locale = CURRENCY_LOCALES.get(code)
    if locale is None:
        return format_currency(amount, code, format=FALLBACK_FORMAT, locale=FALLBACK_LOCALE)
    return format_currency(amount, code, locale=locale)

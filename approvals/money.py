"""Amounts as people read them: each currency in the format of a country that uses it."""

from __future__ import annotations

from decimal import Decimal

from babel.numbers import format_currency, get_currency_precision

# One locale per currency, whoever reads the page: R$ 25,90, $25.90, 25,90 €.
CURRENCY_LOCALES = {"BRL": "pt_BR", "USD": "en_US", "EUR": "de_DE"}
FALLBACK_LOCALE = "en_US"


def money(amount_cents: int, currency: str) -> str:
    """An amount in minor units (2590) in its currency's own format (R$ 25,90)."""
    code = currency.upper()
    # Minor units per the currency (2 for these three, 0 for JPY): never assumed to be cents.
    amount = Decimal(amount_cents).scaleb(-get_currency_precision(code))
    return format_currency(amount, code, locale=CURRENCY_LOCALES.get(code, FALLBACK_LOCALE))

"""What an upstream's declarations must say before Toolgate serves them, and the drift check."""

from __future__ import annotations

import dataclasses
import json
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from dispatch.pipeline.tools import ToolRegistry
from tests.upstreams import payments as declarations
from tests.upstreams.conftest import PaymentsServer
from upstreams.drift import document_drift
from upstreams.http import HttpUpstream, Upstream, upstream_words
from upstreams.registry import Declarations, upstream_load, upstream_register, upstream_unregister
from upstreams.tools import UpstreamDeclarationError, upstream_tools

REVIEWED = json.loads(declarations.UPSTREAM.openapi.read_text())


def module(upstream: HttpUpstream) -> Declarations:
    made: Declarations = SimpleNamespace(
        UPSTREAM=upstream, tools=declarations.tools, CURRENCIES=declarations.CURRENCIES
    )
    return made


def test_a_write_with_neither_idempotency_nor_an_outcome_read_is_refused_at_start_up() -> None:
    upstream = Upstream(declarations.payments_upstream(honours_idempotency_key=False))
    specs = [dataclasses.replace(spec, outcome_of=None) for spec in declarations.tools(upstream)]

    with pytest.raises(UpstreamDeclarationError, match=r"refund_payment .* no outcome_of"):
        upstream_tools(upstream, specs)


def test_an_upstream_that_honours_the_key_may_declare_a_write_without_an_outcome_read() -> None:
    upstream = Upstream(declarations.payments_upstream(honours_idempotency_key=True))
    specs = [dataclasses.replace(spec, outcome_of=None) for spec in declarations.tools(upstream)]

    served = upstream_tools(upstream, specs)

    assert [(spec.name, spec.remote) for spec in served] == [
        ("get_payment", False),
        ("refund_payment", True),
    ]


def test_a_declaration_naming_an_operation_the_document_lacks_is_refused(tmp_path: Path) -> None:
    reviewed = json.loads(json.dumps(REVIEWED))
    del reviewed["paths"]["/refunds"]
    changed = tmp_path / "openapi.json"
    changed.write_text(json.dumps(reviewed))
    upstream = dataclasses.replace(declarations.UPSTREAM, openapi=changed)

    with pytest.raises(UpstreamDeclarationError, match="offers no operation 'listRefunds'"):
        upstream_load(module(upstream))


def test_only_the_declared_tools_are_exposed() -> None:
    registry = ToolRegistry()

    upstream_register(module(declarations.UPSTREAM), registry)
    try:
        exposed = sorted(spec.name for spec in registry)
    finally:
        upstream_unregister("payments", registry)

    # The document offers getPayment, createRefund and listRefunds; two tools are declared.
    assert exposed == ["get_payment", "refund_payment"]
    assert len(registry) == 0


def test_what_an_upstream_says_is_repeated_escaped_and_short() -> None:
    said = upstream_words('<img src=x onerror="alert(1)">\x00\n' + "x" * 500)

    assert "<" not in said and '"' not in said and "\x00" not in said
    assert len(said) < 300


def test_drift_finds_a_tightened_request_and_a_removed_operation() -> None:
    current = json.loads(json.dumps(REVIEWED))
    schemas = current["components"]["schemas"]
    schemas["RefundRequest"]["properties"]["amount_cents"]["minimum"] = 100
    del current["paths"]["/refunds"]
    current["paths"]["/payouts"] = {"post": {"operationId": "createPayout", "responses": {}}}

    drift = document_drift(REVIEWED, current)

    assert drift == ["createRefund: its requestBody changed", "listRefunds: no longer offered"]
    assert document_drift(REVIEWED, REVIEWED) == []


def test_check_upstreams_passes_on_the_reviewed_document(
    payments_honouring: PaymentsServer,
) -> None:
    out = StringIO()

    call_command("check_upstreams", stdout=out)

    assert "payments: as reviewed (get_payment, refund_payment)" in out.getvalue()


def test_check_upstreams_fails_on_drift(payments_honouring: PaymentsServer, tmp_path: Path) -> None:
    current = json.loads(json.dumps(REVIEWED))
    current["components"]["schemas"]["RefundRequest"]["properties"]["currency"]["enum"] = ["BRL"]
    changed = tmp_path / "current.json"
    changed.write_text(json.dumps(current))
    payments_honouring.kill()
    payments_honouring.openapi = changed
    payments_honouring.start()
    err = StringIO()

    with pytest.raises(CommandError, match="payments"):
        call_command("check_upstreams", stderr=err)

    assert "createRefund: its requestBody changed" in err.getvalue()

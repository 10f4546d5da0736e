"""Requests generated from the API's own OpenAPI schema, against the live server: whatever an
agent host sends, the answer is one the schema documents, never a server error, and the ledger
still adds up."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from pytest_django.live_server_helper import LiveServer
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import negative_data_rejection

from tests.conftest import Ledger, MakeAgent


def openapi_document() -> dict[str, Any]:
    """The schema exactly as GET /api/schema/ serves it, built without a server."""
    generator = SchemaGenerator()  # type: ignore[no-untyped-call]
    document: dict[str, Any] = json.loads(
        OpenApiJsonRenderer().render(generator.get_schema(public=True))  # type: ignore[no-untyped-call]
    )
    return document


# Schemathesis's own list, and 422: like a 409, it refuses a well-formed request for what came
# before it (an Idempotency-Key already sent with another request), which no schema can say.
ACCEPTED_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# Built at collection, so that each operation is a test of its own.
schema = schemathesis.openapi.from_dict(
    openapi_document(),
    config=SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_STATUSES}}}
    ),
)


@pytest.fixture
def token(make_agent: MakeAgent, orders: Any) -> str:
    # Budgets no generated sequence reaches, so that every stage stays reachable.
    return make_agent(step_budget=10_000, repeat_limit=10_000)[1]


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    # Fixtures are set up once per operation, not per example, which is what is wanted here; and
    # on a loaded machine generation may be slow without anything being wrong.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_generated_requests_get_documented_answers_and_no_server_error(
    case: Any, live_server: LiveServer, token: str, ledger: Ledger
) -> None:
    case.call_and_validate(
        base_url=live_server.url,
        headers={"Authorization": f"Token {token}"},
        # Arguments of the wrong JSON type are a pipeline outcome by design (a 200 whose code is
        # INVALID_JSON), and an unreadable page size falls back to the default.
        excluded_checks=[negative_data_rejection],
    )
    ledger.state("ORD-1001")
    ledger.state("ORD-1002")

"""Requests generated from the API's own OpenAPI schema, against the live server over real HTTP:
every operation (the agent API, the reviewers' approvals, the managers' metrics), each with the
credentials it asks for; whatever is sent, valid or not, the answer is one the schema documents
(status, headers, body), never a server error, invalid input is refused, and the ledger still adds
up.

CI runs TOOLGATE_FUZZ_EXAMPLES (60) examples per operation: 9 operations, 540 cases.
`bench/fuzz.py` runs the same test with more and prints the tally instead of stopping at the first
finding.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import Group, User
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pytest_django.live_server_helper import LiveServer
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.generation.modes import GenerationMode

from analytics.permissions import MANAGERS_GROUP
from approvals.reviewers import REVIEWERS_GROUP, reviewer_token_create
from dispatch.services import call_dispatch
from tests.conftest import Ledger, MakeAgent

EXAMPLES = int(os.environ.get("TOOLGATE_FUZZ_EXAMPLES", "60"))
# Where set (bench/fuzz.py), findings are counted in this JSON file rather than failing the test.
TALLY = os.environ.get("TOOLGATE_FUZZ_TALLY", "")


def openapi_document() -> dict[str, Any]:
    """The schema exactly as GET /api/schema/ serves it, built without a server."""
    generator = SchemaGenerator()  # type: ignore[no-untyped-call]
    document: dict[str, Any] = json.loads(
        OpenApiJsonRenderer().render(generator.get_schema(public=True))  # type: ignore[no-untyped-call]
    )
    return document


# Schemathesis's own list of answers a valid request may get, and 422: like a 409, it refuses a
# well-formed request for what came before it (an Idempotency-Key already sent with another
# request), which no schema can say. Never a 5xx.
ACCEPTED_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "422", "429"]

# And the managers' 400: a range is valid or not by both its ends and by today's date, an agent's
# id by whether it exists, which the schema's 400 says and no schema can check.
MANAGERS_ACCEPTED_STATUSES = [*ACCEPTED_STATUSES, "400"]

# Built at collection, so that each operation is a test of its own.
schema = schemathesis.openapi.from_dict(
    openapi_document(),
    config=SchemathesisConfig.from_dict(
        {
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_STATUSES}},
            # The schema's own examples are replayed as they are by tests/toolgate/
            # test_api_examples.py; here every case is generated (with real ids, see below).
            "phases": {"examples": {"enabled": False}},
            "operations": [
                {
                    "include-path-regex": "^/api/v1/metrics",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": MANAGERS_ACCEPTED_STATUSES
                        }
                    },
                }
            ],
        }
    ),
)


@dataclass
class Credentials:
    """What each operation's security scheme asks for, and ids that exist, so that valid
    requests reach past the 404s."""

    agent: str
    agent_id: int
    reviewer: str
    confirmation_ids: list[str]
    session_ids: list[str]

    def token_for(self, operation: dict[str, Any]) -> str:
        schemes = {name for requirement in operation.get("security", []) for name in requirement}
        return self.agent if "AgentToken" in schemes else self.reviewer


@dataclass
class Tally:
    cases: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        old = json.loads(path.read_text()) if path.exists() else {}
        merged = {
            "cases": old.get("cases", 0) + self.cases,
            "statuses": dict(Counter(old.get("statuses", {})) + self.statuses),
            "findings": dict(Counter(old.get("findings", {})) + self.findings),
            "examples": {**self.examples, **old.get("examples", {})},
        }
        path.write_text(json.dumps(merged, indent=1))


# The credentials of the running test, for the auth provider below.
CURRENT: dict[str, Credentials] = {}


@schema.auth(refresh_interval=None)
class OperationsOwnCredentials:
    """Each operation with the credentials its security scheme asks for: so schemathesis knows
    them for valid, and checks that the operation refuses a request without them or with wrong
    ones."""

    def get(self, case: Any, ctx: Any) -> str:
        return CURRENT["test"].token_for(case.operation.definition.raw)

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}


@pytest.fixture
def credentials(make_agent: MakeAgent, orders: Any) -> Iterator[Credentials]:
    # Budgets no generated sequence reaches, so that every stage stays reachable; refunds from
    # 50.00 are held, so that there are confirmations to read and decide.
    agent, token = make_agent(step_budget=10_000, repeat_limit=10_000)
    user = User.objects.create_user("fuzz-reviewer", password="pw")
    for name in (REVIEWERS_GROUP, MANAGERS_GROUP):
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    confirmation_ids = []
    for amount in (6_000, 7_000):
        result = call_dispatch(
            agent=agent,
            session_id="fuzz-held",
            customer_id="CUS-1",
            tool="refund_order",
            arguments={
                "order_id": "ORD-1001",
                "amount_cents": amount,
                "currency": "BRL",
                "reason": "damaged",
            },
        )
        assert result.code == "CONFIRMATION_REQUIRED", result
        confirmation_ids.append(str(result.data["confirmation_id"]))
    CURRENT["test"] = Credentials(
        agent=token,
        agent_id=agent.pk,
        reviewer=reviewer_token_create(user=user),
        confirmation_ids=confirmation_ids,
        session_ids=["fuzz-held"],
    )
    yield CURRENT["test"]
    CURRENT.clear()


@pytest.fixture
def tally() -> Iterator[Tally]:
    counted = Tally()
    yield counted
    if TALLY:
        counted.save(Path(TALLY))


def with_real_ids(case: Any, credentials: Credentials, pick: int) -> None:
    """A valid request made to name what exists: still valid, so only where it was."""
    if case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return
    parameters = case.path_parameters or {}
    if "confirmation_id" in parameters:
        ids = credentials.confirmation_ids
        parameters["confirmation_id"] = ids[pick % len(ids)]
    if "agent" in (case.query or {}):
        case.query["agent"] = credentials.agent_id
    if "session_id" in parameters:
        parameters["session_id"] = credentials.session_ids[pick % len(credentials.session_ids)]
    if isinstance(case.body, dict) and "tool" in case.body:
        case.body["tool"] = ["get_order", "refund_order", "get_confirmation_status"][pick % 3]
        case.body["customer_id"] = "CUS-1"


@schema.parametrize()
@schema.given(real=st.booleans(), pick=st.integers(min_value=0, max_value=5))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # Fixtures are set up once per operation, not per example, which is what is wanted here; and
    # on a loaded machine generation may be slow without anything being wrong.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_generated_requests_get_documented_answers_and_no_server_error(
    case: Any,
    real: bool,
    pick: int,
    live_server: LiveServer,
    credentials: Credentials,
    tally: Tally,
    ledger: Ledger,
) -> None:
    if real:
        with_real_ids(case, credentials, pick)
    tally.cases += 1
    try:
        response = case.call_and_validate(base_url=live_server.url)
        tally.statuses[f"{case.operation.label} {response.status_code}"] += 1
    except (Failure, FailureGroup) as exc:
        if not TALLY:
            raise
        failures = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
        for failure in failures:
            key = f"{case.operation.label}: {failure.title}"
            tally.findings[key] += 1
            tally.examples.setdefault(key, f"{failure.message[:400]}\n{case.as_curl_command()}")
    ledger.state("ORD-1001")
    ledger.state("ORD-1002")

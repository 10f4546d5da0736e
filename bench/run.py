"""Run every benchmark of bench/ in one go and print their figures.

Each benchmark is a module of this package with `main(argv) -> dict`: it parses its own options,
prints its figures (or JSON with `--json`, or nothing with `--quiet`) and returns them. The
benchmarks are listed in BENCHMARKS, in the order they run; one whose module is not there yet is
skipped. Nothing is written into the repository: results go to standard output only.

    .venv/bin/python -m bench.run                      # every benchmark (what `make bench` runs)
    .venv/bin/python -m bench.run --only core          # one of them
    .venv/bin/python -m bench.run --only core_history  # (a) over one customer's growing history
    .venv/bin/python -m bench.run --args "core=--calls 5000 --rounds 5"
    .venv/bin/python -m bench.run --json               # one JSON document with every result
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (a) the pipeline core in-process, and its cost per call over one customer's growing history;
# (b) what a statement costs the driver and the server, then the API under gunicorn; (c) the
# manager's figures; (d) the policy what-if, and the agents beside four of them.
BENCHMARKS = ("core", "core_history", "roundtrip", "api", "analytics", "what_if", "audit_keys")
# A benchmark that is another one's mode: that one's module, and the options that select it.
MODES: dict[str, tuple[str, list[str]]] = {
    "core_history": ("core", ["--history", "2000,8000,32000"]),
}


def _importable() -> None:
    # Run as a file (python bench/run.py), sys.path starts with bench/ instead of the project root.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    if str(here.parent) not in sys.path:
        sys.path.insert(0, str(here.parent))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this one (repeatable)"
    )
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="options for one benchmark, e.g. 'core=--calls 5000' (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print every result as one JSON")
    options = parser.parse_args(argv)

    extra: dict[str, list[str]] = {}
    for item in options.args:
        name, _, args = item.partition("=")
        if name not in BENCHMARKS:
            parser.error(f"--args: no benchmark is named {name!r}")
        extra.setdefault(name, []).extend(shlex.split(args))

    _importable()
    results: dict[str, Any] = {}
    failed = False
    for name in options.only or BENCHMARKS:
        module, mode = MODES.get(name, (name, []))
        module_name = f"bench.{module}"
        if importlib.util.find_spec(module_name) is None:
            if not options.json:
                print(f"[{name}] skipped: {module_name} does not exist yet\n")
            results[name] = {"skipped": f"{module_name} does not exist yet"}
            continue
        argv_of = [*mode, *extra.get(name, []), *(["--quiet"] if options.json else [])]
        started = time.perf_counter()
        try:
            module = importlib.import_module(module_name)
            result = module.main(argv_of)
        except (Exception, SystemExit) as exc:
            failed = True
            if isinstance(exc, SystemExit) and isinstance(exc.code, int):
                message = f"exited with status {exc.code}"
            elif isinstance(exc, SystemExit):
                message = str(exc.code)
            else:
                message = f"{type(exc).__name__}: {exc}"
            print(f"[{name}] FAILED: {message}", file=sys.stderr)
            if not isinstance(exc, SystemExit):
                traceback.print_exc()
            results[name] = {"error": message}
            continue
        results[name] = result
        if not options.json:
            print(f"[{name}] {time.perf_counter() - started:.1f} s\n")
    if options.json:
        print(json.dumps(results, indent=2))
    if failed:
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])

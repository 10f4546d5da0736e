"""Schemathesis against the live server, at length: the CI test of tests/e2e/test_schemathesis.py
(every operation of the OpenAPI schema, with its credentials, over real HTTP) run with many more
examples, every finding counted instead of the first one failing the run.

    .venv/bin/python bench/fuzz.py                  # 1,200 examples per operation, ~10,800 cases
    .venv/bin/python bench/fuzz.py --examples 200   # a shorter run
    .venv/bin/python bench/fuzz.py -k metrics       # some operations (pytest's -k)

With the environment of the test suite (DATABASE_URL and the rest; PostgreSQL is what production
runs). Prints the cases run, the server errors and the schema findings, and exits 1 if there was
any finding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/e2e/test_schemathesis.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1200, help="per operation (1200)")
    parser.add_argument("-k", dest="only", help="only the operations pytest's -k selects")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="toolgate-fuzz-") as directory:
        tally_path = Path(directory) / "tally.json"
        env = {
            **os.environ,
            "TOOLGATE_FUZZ_EXAMPLES": str(options.examples),
            "TOOLGATE_FUZZ_TALLY": str(tally_path),
        }
        started = time.monotonic()
        completed = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:randomly", "-p"),
                *("no:logging", *(("-k", options.only) if options.only else ())),
            ],
            cwd=ROOT,
            env=env,
            check=False,
        )
        elapsed = time.monotonic() - started
        if not tally_path.exists():
            print(f"no tally: pytest exited {completed.returncode}")
            return 2
        tally = json.loads(tally_path.read_text())
    statuses: Counter[str] = Counter(tally["statuses"])
    findings: Counter[str] = Counter(tally["findings"])
    server_errors = sum(n for key, n in statuses.items() if key.rsplit(" ", 1)[1] >= "500") + sum(
        n for key, n in findings.items() if "Server error" in key
    )
    schema_findings = sum(n for key, n in findings.items() if "Server error" not in key)
    operations = sorted({key.rsplit(" ", 1)[0] for key in statuses})
    print(f"\ncases run: {tally['cases']} over {len(operations)} operations in {elapsed:.0f} s")
    print(f"server errors: {server_errors}")
    print(f"schema findings: {schema_findings}")
    print("answers per operation:")
    for operation in operations:
        answers = {
            key.rsplit(" ", 1)[1]: n
            for key, n in sorted(statuses.items())
            if key.rsplit(" ", 1)[0] == operation
        }
        print(f"  {operation}: {answers}")
    for key, count in findings.most_common():
        print(f"finding x{count}: {key}\n{tally['examples'].get(key, '')}\n")
    return 1 if findings or completed.returncode else 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/architecture.md's Layout names only what is there: every folder and file it lists, and
every file or path its descriptions mention, exists in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A file name (models.py, tests/regressions/) or a path with a slash (static/vendor/).
_NAMED = re.compile(r"(?<![\w./-])((?:[\w-]+/)+(?:[\w-]+\.\w+)?|[\w-]+\.(?:py|md|toml))(?![\w/])")


def layout_lines() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"^## Layout\n\n```\n(.*?)^```", text, re.S | re.M)
    assert block is not None, "docs/architecture.md has no Layout block"
    return block.group(1).splitlines()


def named_paths() -> list[tuple[str, Path]]:
    """(the line, the path it names), each resolved where the Layout puts it: an entry in its
    folder, a mention in the description of its entry (or of the entry it continues)."""
    named = []
    folder = context = ROOT
    for line in layout_lines():
        entry = line[:19].strip()
        if entry:
            parent = folder if line.startswith("  ") else ROOT
            path = parent / entry
            named.append((line, path))
            if not line.startswith("  "):
                folder = path if entry.endswith("/") else ROOT
            context = path if entry.endswith("/") else path.parent
        for match in _NAMED.finditer(line[19:]):
            mentioned = match.group(1)
            candidates = [context / mentioned, folder / mentioned, ROOT / mentioned]
            found = next((path for path in candidates if path.exists()), candidates[0])
            named.append((line, found))
    return named


def test_every_path_the_layout_names_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)} ({line.strip()})"
        for line, path in named_paths()
        if not path.exists()
    ]

    assert missing == []


def test_the_layout_names_every_app() -> None:
    listed = {line[:19].strip().rstrip("/") for line in layout_lines() if not line.startswith(" ")}
    apps = {path.parent.name for path in ROOT.glob("*/apps.py")}

    assert apps <= listed

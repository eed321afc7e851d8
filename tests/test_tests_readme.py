"""tests/README.md maps every module of the package to its tests: a module's tests are found from its path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "procexec"
ROW = re.compile(r"^\| `([\w/]+\.py)` \| (.+) \|$")


def _map() -> dict[str, list[str]]:
    rows = {}
    for line in (REPO / "tests" / "README.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match.group(1) not in rows, f"tests/README.md: two rows for {match.group(1)}"
            rows[match.group(1)] = re.findall(r"`([\w.]+)`", match.group(2))
    return rows


def _holds_code(path: Path) -> bool:
    """Anything beyond a docstring and ``from __future__`` (an empty package's ``__init__.py`` needs no row)."""
    return any(
        not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        for node in ast.parse(path.read_text()).body
    )


def test_every_module_has_a_row_and_every_row_a_module():
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if _holds_code(p)}
    rows = set(_map())
    assert sorted(modules - rows) == [], "modules without a row in tests/README.md"
    assert sorted(rows - modules) == [], "rows of tests/README.md naming no module (moved or removed?)"


def test_every_test_file_named_exists():
    named = {test for tests in _map().values() for test in tests}
    assert named and all(name.startswith("test_") for name in named)
    assert sorted(name for name in named if not (REPO / "tests" / name).is_file()) == []

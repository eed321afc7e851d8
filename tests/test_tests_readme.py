"""tests/README.md maps every module of the package to its tests: a module's tests are found from its path, and
every test file has its place in the map.  The folders' rules hold: test file names unique, no test file importing
another, the slow modules conftest.py hands out first all there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PACKAGE = REPO / "src" / "procexec"
ROW = re.compile(r"^\| `([\w/]+\.py)` \| (.+) \|$")
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def _map() -> dict[str, list[str]]:
    rows = {}
    for line in (REPO / "tests" / "README.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match.group(1) not in rows, f"tests/README.md: two rows for {match.group(1)}"
            rows[match.group(1)] = re.findall(r"`([\w./]+)`", match.group(2))
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
    assert named and all(Path(name).name.startswith("test_") for name in named)
    assert sorted(name for name in named if not (TESTS / name).is_file()) == []


def test_every_test_file_is_named_in_the_map():
    """In a row, or in the prose (the workflow's runs, the checks of the checkout), by its path under tests/."""
    text = (TESTS / "README.md").read_text()
    assert TEST_FILES
    assert [
        p.relative_to(TESTS).as_posix() for p in TEST_FILES if f"`{p.relative_to(TESTS).as_posix()}`" not in text
    ] == []


def test_test_file_names_are_unique_and_no_test_file_imports_another():
    """pytest imports a test file by its name alone (no __init__.py): a second file of that name would not collect,
    and ``from test_x import ...`` would depend on which folder pytest put on sys.path first."""
    names = [p.name for p in TEST_FILES]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    imports = {
        f"{p.relative_to(TESTS)}: {node.module if isinstance(node, ast.ImportFrom) else alias.name}"
        for p in TEST_FILES
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
        if ((node.module or "") if isinstance(node, ast.ImportFrom) else alias.name).startswith("test_")
    }
    assert sorted(imports) == []


def test_the_slow_modules_conftest_orders_first_exist():
    """A renamed module would silently drop out of the order (and run last, alone on one worker)."""
    from conftest import SLOW_MODULES

    assert len(set(SLOW_MODULES)) == len(SLOW_MODULES)
    assert sorted(set(SLOW_MODULES) - {p.name for p in TEST_FILES}) == []

"""The docs name only modules and files that exist: a module moved or renamed is a failing test, not a stale page.

Checked outside fenced code blocks (an example may name the module a reader is about to write): dotted names
(``procexec.io.files.atomic_write``), module paths in the package (``generation/store.py``,
``src/procexec/records.py``) and the checkout's code files (``tests/test_layers.py``,
``tests/generation/test_store.py``, ``rules/common.smk``), and test files by their path under tests/
(``generation/test_store.py``, as tests/README.md names them).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "procexec"
PAGES = [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SUBPACKAGES = "|".join(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
DOTTED = re.compile(r"\bprocexec(?:\.[A-Za-z_]\w*)+")
# In the package: `src/procexec/records.py`, or `generation/store.py` not preceded by a name or a slash
# (`vllm/engine/arg_utils.py` is another project's file).
PACKAGE_PATH = re.compile(rf"src/procexec/([\w/]*\w\.py)\b|(?<![\w/.-])((?:{SUBPACKAGES})/[\w/]*\w\.py)\b")
CHECKOUT_PATH = re.compile(r"(?<![\w/.-])(?:(?:tests|benchmarks|workflow_scripts)/(?:\w+/)*\w+\.py|rules/\w+\.smk)\b")
# A test file by its path under tests/ (tests/README.md's map): `generation/test_store.py`, `test_layers.py`.
TEST_PATH = re.compile(r"(?<![\w/.-])(?!tests/)((?:\w+/)*test_\w+\.py)\b")


def _resolves(dotted: str) -> bool:
    """``procexec.a.b`` is a module, or a module and attributes of it (``procexec.io.files.atomic_write``)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _prose(page: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _missing(page: Path) -> list[str]:
    missing = []
    for number, line in _prose(page):
        missing += [f"{number}: {ref}" for ref in DOTTED.findall(line) if not _resolves(ref)]
        paths = [a or b for a, b in PACKAGE_PATH.findall(line) if not Path(a or b).name.startswith("test_")]
        missing += [f"{number}: {ref}" for ref in paths if not (PACKAGE / ref).is_file()]
        missing += [f"{number}: {ref}" for ref in TEST_PATH.findall(line) if not (REPO / "tests" / ref).is_file()]
        missing += [f"{number}: {ref}" for ref in CHECKOUT_PATH.findall(line) if not (REPO / ref).is_file()]
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_modules_and_files_a_page_names_exist(page):
    assert _missing(page) == [], f"{page.relative_to(REPO)} names what does not exist"


def test_a_stale_name_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "`procexec.io.files.atomic_write` and `generation/store.py`, `src/procexec/records.py`;\n"
        "gone: `procexec.inference.settings`, `vllm_backend.py` in `inference/vllm_backend.py`,\n"
        "`src/procexec/inference/settings.py`, `tests/test_gone.py`; another project's `vllm/config/model.py`\n"
        "`tests/io/test_files.py` and `io/test_files.py` are here, `tests/inference/test_job.py` and\n"
        "`generation/test_jsonio.py` are gone\n"
        "```python\nfrom procexec.generation.backends.echo import EchoBackend\n```\n"
    )
    assert _missing(page) == [
        "2: procexec.inference.settings",
        "3: inference/settings.py",
        "3: tests/test_gone.py",
        "4: tests/inference/test_job.py",
        "5: generation/test_jsonio.py",
    ]

"""The package's design as import contracts (pyproject.toml, [tool.importlinter]), no import cycle, no module over
600 lines.

grimp reads every import statement of every module, lazy ones inside functions included. Neither grimp nor
lint-imports leaves a cache in the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "procexec"
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
ENGINE_SIDE_PACKAGES = {"procexec.engine", "procexec.preparation", "procexec.generation"}


def _lint_imports(workdir: Path, package_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports on the installed package, or on the copy in ``package_dir``, run in ``workdir`` (where a cache
    would go)."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = os.environ if package_dir is None else {**os.environ, "PYTHONPATH": str(package_dir)}
    done = subprocess.run(
        [str(lint), "--no-cache", str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        check=False,
    )
    assert list(workdir.glob(".*cache*")) == [], "lint-imports left a cache"
    return done


def _layer_packages() -> list[str]:
    """Every package named by the layers contract ("a | b" names two)."""
    layers = next(c for c in CONTRACTS if c["type"] == "layers")["layers"]
    return [name.strip() for layer in layers for name in layer.split("|")]


def test_the_layer_contract_is_kept(tmp_path):
    done = _lint_imports(tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout


INDEPENDENT = "analysis, release and harness are independent of the engine-side packages"


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("benchmark/suite.py", "import procexec.config.model", "procexec layers"),  # upward: config sits above
        ("scoring/score.py", "import procexec.config.model", "procexec layers"),  # siblings of one layer
        ("analysis/study.py", "import procexec.generation.store", INDEPENDENT),
        ("release/folder.py", "import procexec.generation.store", INDEPENDENT),
        ("harness/samples.py", "import procexec.preparation.staging", INDEPENDENT),
        ("harness/importer.py", "import procexec.engine.device", INDEPENDENT),  # beyond prompting and tokenizer
        ("cluster/status.py", "from procexec.analysis import study", "cluster does not import analysis"),
        ("analysis/aggregate.py", "import vllm", "vllm, torch and transformers only in the engine-side packages"),
    ],
)
def test_the_contract_breaks_on_a_planted_import(tmp_path, module, planted, contract):
    """A copy of the package with one forbidden import added is refused, naming the contract and the import."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "procexec", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "procexec" / module
    target.write_text(target.read_text() + f"\n{planted}\n")
    done = _lint_imports(tmp_path, copy)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{contract} BROKEN" in done.stdout
    importer = "procexec." + module.removesuffix(".py").replace("/", ".")
    imported = planted.split()[1]
    assert f"{importer} -> {imported}" in done.stdout


def test_every_module_is_in_a_layer():
    layers = _layer_packages()
    graph = grimp.build_graph("procexec", cache_dir=None)
    loose = sorted(
        m
        for m in graph.modules
        if m != "procexec" and not any(m == layer or m.startswith(layer + ".") for layer in layers)
    )
    assert not loose, f"modules outside every layer of the contract: {loose}"


def test_every_package_but_the_inference_ones_is_barred_from_the_engines():
    """A new package is held by the vllm/torch/transformers contract as soon as it joins a layer."""
    engines = next(c for c in CONTRACTS if "vllm" in c.get("forbidden_modules", []))
    assert sorted(engines["source_modules"]) == sorted(set(_layer_packages()) - ENGINE_SIDE_PACKAGES)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    graph = grimp.build_graph("procexec", cache_dir=None)
    graph.remove_module("procexec")  # the root package: __version__ and the SPEC_VERSION constant only
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


#: A module a reader can hold in mind: past this, it is split along a seam it can name (issue 39).
MODULE_LINES = 600


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}, f"modules over {MODULE_LINES} lines: split them along a seam"

"""The conda environment files (envs/*.yaml) agree with pyproject.toml.

Conda is not installed on the development machines, so the environments
cannot be built here; what can be checked is that every pinned package that
pyproject.toml also names satisfies pyproject's requirement, that the analysis
environment carries every core dependency, that Python matches
requires-python, and that every rule's `conda:` file exists.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# conda-forge names that differ from the PyPI distribution.
CONDA_TO_PYPI = {"matplotlib-base": "matplotlib", "pytorch": "torch", "python-gguf": "gguf"}


def _pyproject_requirements() -> dict[str, list[Requirement]]:
    reqs: dict[str, list[Requirement]] = {}
    project = PYPROJECT["project"]
    texts = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        texts += extra
    for text in texts:
        req = Requirement(text)
        reqs.setdefault(canonicalize_name(req.name), []).append(req)
    return reqs


def _pins(env: dict) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """(conda pins, pip pins) as (name, exact version or None)."""
    conda, pip = [], []
    for dep in env.get("dependencies", []):
        if isinstance(dep, dict):
            for line in dep.get("pip", []):
                if line.startswith("-"):
                    continue
                req = Requirement(line)
                exact = [s.version for s in req.specifier if s.operator == "=="]
                pip.append((canonicalize_name(req.name), exact[0] if exact else None))
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(?:==?\s*([^\s=<>!,]+))?.*", dep.split("::")[-1])
        assert m, dep
        name = CONDA_TO_PYPI.get(m.group(1), m.group(1))
        conda.append((canonicalize_name(name), m.group(2)))
    return conda, pip


def test_there_is_an_analysis_environment():
    assert (REPO / "envs" / "analysis.yaml").exists()


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_pins_satisfy_pyproject(env_file: Path):
    env = yaml.safe_load(env_file.read_text())
    reqs = _pyproject_requirements()
    conda, pip = _pins(env)
    for name, version in conda + pip:
        if name == "python":
            if version:
                major_minor = ".".join(version.split(".")[:2])
                assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(
                    f"{major_minor}.0"
                ), f"{env_file.name}: python {version} vs requires-python"
            continue
        for req in reqs.get(name, []):
            if version is None:
                continue
            assert req.specifier.contains(version, prereleases=True), (
                f"{env_file.name}: {name}=={version} does not satisfy pyproject's '{req}'"
            )


def test_analysis_environment_pins_every_core_dependency():
    env = yaml.safe_load((REPO / "envs" / "analysis.yaml").read_text())
    conda, pip = _pins(env)
    pinned = {name: version for name, version in conda + pip}
    for text in PYPROJECT["project"]["dependencies"]:
        name = canonicalize_name(Requirement(text).name)
        assert name in pinned, f"envs/analysis.yaml lacks {name}"
        assert pinned[name], f"envs/analysis.yaml: {name} is not pinned to an exact version"


def test_every_rule_conda_file_exists():
    common = (REPO / "rules" / "common.smk").read_text()
    named = set(re.findall(r'"\.\./envs/([^"]+\.yaml)"', common))
    for path in (REPO / "rules").glob("*.smk"):
        named |= set(re.findall(r'"\.\./envs/([^"{]+\.yaml)"', path.read_text()))
    assert "analysis.yaml" in named
    existing = {p.name for p in ENV_FILES}
    # rules/common.smk picks the inference env that exists (inference-cuda.yaml or inference.yaml)
    assert (named & existing) >= {"analysis.yaml"}
    assert (REPO / "envs" / "analysis.post-deploy.sh").exists()

"""A non-editable install (``uv pip install .`` into a fresh virtual environment, core dependencies only)
runs the pipeline and renders the report: schemas and templates are package data.

The package sources (pyproject.toml, README.md, src/) are copied to a scratch folder first, so the
build never writes into the checkout and no stale ``build/`` of an earlier install can leak in.
The install takes seconds from uv's cache (numpy, pandas, pyarrow, matplotlib...), which make test's own install
filled; the pipeline run after it most of the test's time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DATASET = "mixed_int_1-10_k2"

pytestmark = pytest.mark.install


def test_a_non_editable_install_renders_the_report(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    # uv builds the wheel through the same PEP 517 backend pip would (setuptools) and installs from its cache,
    # which make test's own install filled (pip resolved and unpacked every wheel again: ~25 s of CPU more)
    uv = Path(sys.executable).with_name("uv")
    pip = subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(source)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    shutil.rmtree(source)  # the installed package must not need its sources

    work = tmp_path / "work"
    work.mkdir()

    def procexec(*args: object, cwd: Path = work) -> str:
        proc = subprocess.run(
            [str(venv / "bin" / "procexec"), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd
        )
        assert proc.returncode == 0, (args, proc.stderr[-3000:])
        return proc.stdout

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import procexec; print(procexec.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    ).stdout
    assert str(venv) in where and str(REPO) not in where, where

    # Outside a checkout (no config.yaml here, none named): the paper's suite is package data too.
    empty = tmp_path / "empty"
    empty.mkdir()
    procexec("generate", "--dataset", DATASET, "--examples-per-length", 2, "--out", "packaged.jsonl", cwd=empty)
    procexec(
        "generate",
        "--config",
        REPO / "config.yaml",
        "--dataset",
        DATASET,
        "--examples-per-length",
        2,
        "--out",
        work / "checkout.jsonl",
    )
    assert (empty / "packaged.jsonl").read_bytes() == (work / "checkout.jsonl").read_bytes()

    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["suite"].update(seed=2, lengths=[5], examples_per_length=3, datasets=[DATASET])
    raw["models"]["simulator"] = {
        "abbrev": "SIM",
        "hf_id": "procexec/simulator",
        "gpus": 0,
        "shards": 1,
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
    }
    raw["run_models"] = ["simulator"]
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    data, refs, gens = (
        work / "datasets" / f"{DATASET}.jsonl",
        work / "references" / f"{DATASET}.jsonl",
        work / "generations" / "simulator" / f"{DATASET}.jsonl.gz",
    )
    procexec("check-config", config)  # the JSON schema is package data
    procexec("generate", "--config", config, "--dataset", DATASET, "--out", data)
    procexec("execute", "--in", data, "--out", refs)
    procexec("simulate", "--dataset", data, "--references", refs, "--out", gens, "--target-chars", "300")
    procexec("score", "--generations", gens, "--references", refs, "--dataset", data, "--out", work / "s.parquet")
    procexec("aggregate", "--scores", work / "s.parquet", "--out-dir", work / "aggregate", "--resamples", "10")
    common = ["--config", config, "--aggregate-dir", work / "aggregate"]
    procexec("figures", *common, "--out-dir", work / "figures", "--workers", "1", "--dpi", "20")
    procexec("tables", *common, "--references-dir", work / "references", "--out-dir", work / "tables")
    procexec(
        "report",
        *common,
        "--figures-dir",
        work / "figures",
        "--tables-dir",
        work / "tables",
        "--generations-dir",
        work / "generations",
        "--references-dir",
        work / "references",
        "--out",
        work / "report" / "index.html",
    )
    page = (work / "report" / "index.html").read_text()
    assert "reproduction report" in page and 'id="model-simulator"' in page and "<img" in page

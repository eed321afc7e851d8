"""The Snakemake workflow (Snakefile + rules/*.smk) end to end and its rerun rules.

* e2e: config/test-tiny.yaml with the tiny Llama (source tiny-llama, built by
  `procexec prepare-model`) on the real vLLM CPU engine, in a scratch working
  directory, up to the report (or the aggregate while `procexec report` does
  not exist); then a second dry run has nothing to do, adding a model lists
  exactly that model's jobs plus aggregate/figures/tables/report, and changing
  one model's settings reruns only that model; a copy of the finished study
  gains an endpoint model and a job-server model, which run only their jobs and
  generate what the in-process model did.
* a broken config stops before any job, naming the key;
* `snakemake --lint` and `snakefmt --check` are clean;
* the full paper study (config.yaml) dry-runs with the expected job counts and
  GPU resources.

All dry runs and runs use `--directory <tmp>`: nothing is written to the checkout.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from procexec.io.jsonl import read_jsonl
from workflow_runs import (
    LOCAL_RUN,
    REPO,
    SNAKEFILE,
    TINY,
    check_modes,
    snakemake,
    venv_tool,
    workflow_env,
    write_yaml,
)

pytestmark = pytest.mark.workflow

# Rules that run once per workflow, after every model (rerun whenever run_models changes).
FINAL_RULES = {"aggregate", "figures", "tables", "report", "all"}


def job_stats(output: str) -> Counter:
    """The dry run's "Job stats" table as {rule: count} (the first table; without the total)."""
    lines = output.splitlines()
    try:
        start = lines.index("Job stats:")
    except ValueError:
        return Counter()
    counts: Counter = Counter()
    for line in lines[start + 3 :]:
        m = re.fullmatch(r"\s*(\S+)\s+(\d+)\s*", line)
        if not m or m.group(1) == "total":
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def has_command(name: str) -> bool:
    proc = subprocess.run([venv_tool("procexec"), name, "--help"], capture_output=True, env=workflow_env())
    return proc.returncode == 0


def targets() -> list[str]:
    """The whole workflow when the report command exists, else everything up to the aggregate."""
    if all(has_command(c) for c in ("figures", "tables", "report")):
        return ["all"]
    return ["results/aggregate/metrics.parquet", "results/datasets/CARD.md", "results/references/table4.csv"]


# ----------------------------------------------------------------------------- end to end


PILOT_K = 1  # of the tiny suite's 2 examples per length
#: The smoke's context: the tiny Llama's prompts are 600-760 tokens, so each continuation runs 130-290 tokens to it
#: (the untrained model never stops), not 770-910 as at 1,536 (a third of the decode steps)
SMOKE_CONTEXT = 896
SMOKE_SHARD = "results/smoke/generations/tiny-llama/shards/1-of-1.jsonl.gz"
#: Real lm-eval samples of the tiny study's examples, from a scripted model (tests/data/harness/README.md).
HARNESS_LOGS = f"{REPO}/tests/data/harness/lm-eval/samples_*.jsonl"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory):
    """Real runs of config/test-tiny.yaml (tiny Llama, vLLM CPU) in a scratch directory, in the README's
    order: the smoke stage's inference (with continuation reruns on), the pilot (the first example of
    every cell), then the full study."""
    workdir = tmp_path_factory.mktemp("workflow")
    wanted = targets()
    smoke = write_yaml(
        workdir.parent / f"{workdir.name}-smoke.yaml",
        {
            "stage": "smoke",
            "inference": {"truncation_rerun": "continue"},
            "smoke": {"lengths": [5, 15], "max_new_tokens": 16, "max_context": SMOKE_CONTEXT},
        },
    )
    # each stage as far as its test needs: the smoke's and the pilot's generations (with its loops and its
    # projection of the full study), then the whole study
    pilot = [
        f"results/pilot/generations/tiny-llama/{ds}.jsonl.gz"
        for ds in yaml.safe_load(TINY.read_text())["suite"]["datasets"]
    ] + ["results/pilot/loops/tiny-llama.json", "results/pilot/cost.json"]
    store = workdir / "results" / "generations" / "tiny-llama" / "store"
    for stage, overlays, targets_ in (("smoke", [smoke], [SMOKE_SHARD]), ("pilot", [], pilot), ("full", [], wanted)):
        proc = snakemake(
            workdir,
            *LOCAL_RUN,
            "--show-failed-logs",
            *targets_,
            "--config",
            f"stage={stage}",
            f"pilot_examples_per_length={PILOT_K}",
            configfiles=[TINY, *overlays],
        )
        if proc.returncode != 0:
            pytest.fail(f"{stage} stage failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
        if stage == "pilot":  # what the smoke and the pilot stored, byte for byte (each stage's own segments)
            for segment in ("smoke-1-of-1.seg", "pilot-1-of-1.seg"):
                (workdir / segment).write_bytes((store / segment).read_bytes())
    return workdir, wanted


@pytest.mark.vllm
def test_tiny_workflow_runs_end_to_end(tiny_run):
    workdir, wanted = tiny_run
    results = workdir / "results"
    cfg = yaml.safe_load(TINY.read_text())
    datasets = cfg["suite"]["datasets"]
    for ds in datasets:
        assert (results / "datasets" / f"{ds}.jsonl").stat().st_size > 0
        assert (results / "references" / f"{ds}.jsonl").stat().st_size > 0
        assert (results / "generations" / "tiny-llama" / f"{ds}.jsonl.gz").stat().st_size > 0
        assert (results / "scores" / "tiny-llama" / f"{ds}.parquet").stat().st_size > 0
    shards = cfg["models"]["tiny-llama"]["shards"]
    for i in range(1, shards + 1):
        assert (results / "generations" / "tiny-llama" / "shards" / f"{i}-of-{shards}.jsonl.gz").exists()
        # The report engineer sums these into GPU-hours.
        assert (workdir / "results" / "benchmarks" / "infer" / "tiny-llama" / f"{i}-of-{shards}.tsv").exists()
    assert (results / "aggregate" / "metrics.parquet").exists()
    assert (results / "datasets" / "CARD.md").exists()
    assert (results / "references" / "table4.csv").exists()
    if wanted == ["all"]:
        page = (results / "report" / "index.html").read_text()
        assert page.count('<details class="prompt"') == 1 and 'id="prompt-tiny-llama"' in page
        assert "&lt;|im_start|&gt;system" in page  # the rendered prompt, escaped
        shown = json.loads((results / "prompts" / "tiny-llama.json").read_text())
        assert shown["sha256"][:16] in page and shown["prompt_tokens"] > 0
    # every job left a log and a benchmark
    for rule in (
        "generate",
        "execute",
        "prepare_model",
        "show_prompt",
        "check_model",
        "infer",
        "collect",
        "score",
        "aggregate",
    ):
        assert any((workdir / "logs" / rule).rglob("*.log")), rule
        assert any((workdir / "results" / "benchmarks" / rule).rglob("*.tsv")), rule
    # the resumable store is not a workflow output but exists beside the generations
    assert (results / "generations" / "tiny-llama" / "store").is_dir()
    check_modes(results, 0o022)  # the group-writable 002 is checked through SLURM (test_slurm_workflow.py)


def _infer_counts(logs: Path) -> tuple[int, int]:
    """(generated, from the store) summed over the infer jobs' logs under ``logs``."""
    counts = [
        re.search(r"(\d+) generated .*?, (\d+) from the store", p.read_text())
        for p in sorted((logs / "infer").rglob("*.log"))
    ]
    assert counts and all(counts), [p.name for p in (logs / "infer").rglob("*.log")]
    return sum(int(m.group(1)) for m in counts), sum(int(m.group(2)) for m in counts)


@pytest.mark.vllm
def test_the_smoke_stage_truncates_and_continues_every_example(tiny_run):
    """8 examples, each cut at the smoke's 16 tokens and continued (prompt + its ids) up to its context."""
    workdir, _ = tiny_run
    records = [obj for _, obj in read_jsonl(workdir / SMOKE_SHARD)]
    first = {r["id"]: r for r in records if r["attempt"] == 1}
    second = {r["id"]: r for r in records if r["attempt"] == 2}
    assert len(first) == 8 and all(
        r["finish_reason"] == "length" and r["num_generated_tokens"] == 16 for r in first.values()
    )
    assert second.keys() == first.keys()
    for key, rerun in second.items():
        assert rerun["continues_attempt"] == 1 and rerun["token_ids"][:16] == first[key]["token_ids"]
        assert 16 < rerun["num_generated_tokens"] <= SMOKE_CONTEXT - rerun["prompt_tokens"]
    assert not (workdir / "results" / "smoke" / "report").exists()  # only its inference was asked for


@pytest.mark.vllm
def test_the_pilot_stage_is_reused_by_the_full_study_and_keeps_its_own_outputs(tiny_run):
    """The pilot wrote under results/pilot/ (one shard, the first example per cell) and the full
    run generated exactly the examples the pilot had not: nothing is generated twice."""
    workdir, wanted = tiny_run
    cfg = yaml.safe_load(TINY.read_text())
    cells = len(cfg["suite"]["datasets"]) * len(cfg["suite"]["lengths"])
    pilot = workdir / "results" / "pilot"
    assert sorted(p.name for p in (pilot / "generations" / "tiny-llama" / "shards").iterdir()) == ["1-of-1.jsonl.gz"]
    for ds in cfg["suite"]["datasets"]:
        lines = (pilot / "datasets" / f"{ds}.jsonl").read_text().splitlines()
        assert [json.loads(line)["index"] for line in lines] == [0] * len(cfg["suite"]["lengths"])
    assert _infer_counts(workdir / "logs" / "pilot") == (PILOT_K * cells, 0)
    # the model checked once, by the pilot, for both stages (the same contexts): the full run found it done
    check = workdir / "results" / "models" / "tiny-llama" / "check.json"
    pilot_shard = pilot / "generations" / "tiny-llama" / "shards" / "1-of-1.jsonl.gz"
    assert not (pilot / "models").exists() and check.stat().st_mtime < pilot_shard.stat().st_mtime
    total = cfg["suite"]["examples_per_length"] * cells
    assert _infer_counts(workdir / "logs") == (total - PILOT_K * cells, PILOT_K * cells)
    # the smoke's and the pilot's generations are in the store as the pilot left them, each stage's segments
    # its own (the cost account measures the pilot's, status leaves the smoke's out)
    store = workdir / "results" / "generations" / "tiny-llama" / "store"
    shards = cfg["models"]["tiny-llama"]["shards"]
    stages = {"smoke-1-of-1.seg", "pilot-1-of-1.seg"}
    full = {p.name for p in store.glob("*.seg")} - stages  # a shard with nothing left to generate writes none
    assert full and full <= {f"{i}-of-{shards}.seg" for i in range(1, shards + 1)}, full
    for segment in stages:
        assert (store / segment).read_bytes() == (workdir / segment).read_bytes()
    # the full study's outputs beside the pilot's, each stage's own
    for ds in cfg["suite"]["datasets"]:
        ids = [obj["id"] for _, obj in read_jsonl(pilot / "generations" / "tiny-llama" / f"{ds}.jsonl.gz")]
        full = [
            obj["id"] for _, obj in read_jsonl(workdir / "results" / "generations" / "tiny-llama" / f"{ds}.jsonl.gz")
        ]
        assert len(ids) == PILOT_K * len(cfg["suite"]["lengths"]) and set(ids) < set(full)
    # the pilot's loops and its projection of the full study (rules/loops.smk: what its report's Loops section reads)
    loops = json.loads((pilot / "loops" / "tiny-llama.json").read_text())
    assert loops["model"] == "tiny-llama" and loops["examples"] == PILOT_K * cells
    assert loops["guard_source"] == "candidate" and len(loops["stopped"]) == loops["guard_stops"] <= loops["reruns"]
    [row] = json.loads((pilot / "cost.json").read_text())["models"]
    assert row["basis"] == "measured" and row["examples"] == total  # the full study, from the pilot's store


@pytest.mark.vllm
def test_snakemakes_own_report_shows_figures_tables_and_the_appendix_with_captions(tiny_run):
    workdir, wanted = tiny_run
    assert wanted == ["all"], "the tiny run must reach the report"
    proc = snakemake(workdir, "--report", "snakemake-report.html", configfiles=[TINY])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = (workdir / "snakemake-report.html").read_text()
    for caption in ("reports/captions/figures.rst", "reports/captions/tables.rst", "reports/captions/appendix.rst"):
        first_words = " ".join((REPO / caption).read_text().split()[:4])
        assert first_words in page, caption
    assert "index.html" in page and "Appendix report" in page


@pytest.mark.vllm
def test_second_run_is_a_no_op(tiny_run):
    workdir, wanted = tiny_run
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY])
    assert proc.returncode == 0, proc.stderr
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def _cwd(pid: str) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:  # gone meanwhile
        return None


@pytest.mark.vllm
def test_adding_an_endpoint_a_job_server_and_an_imported_model_runs_their_jobs_only_up_to_the_report(
    tiny_run, tiny_manifest, tmp_path
):
    """The finished tiny study (a copy) gains two models on the same weights: `tiny-endpoint` through a real
    vLLM OpenAI-compatible server on 127.0.0.1 (backend: openai, from the submit host) and `tiny-server`
    through a server its own generation job starts and stops (backend: vllm-server, the frontier models'
    route).  Only their jobs run; greedy, they generate what the in-process `tiny-llama` did.  A third,
    `tiny-imported`, was evaluated elsewhere (backend: imported, real lm-eval samples of the tiny study in
    tests/data/harness): one import job, no staging, prompt, check or inference, and the report shows it beside
    the others with the scores `procexec import-harness` + `procexec score` give by hand."""
    from endpoint_fixtures import VLLMServer

    workdir = tmp_path / "work"
    shutil.copytree(tiny_run[0], workdir, symlinks=True)  # keeps mtimes: the copy is as up to date
    server = VLLMServer(tiny_manifest.parent / "hf", tmp_path / "server.log").start()
    try:
        tiny = yaml.safe_load(TINY.read_text())["models"]["tiny-llama"]
        endpoint = {  # its tokenizer from the weights' folder, as the job server's (no second build of the model)
            **{k: v for k, v in tiny.items() if k != "source"},
            "abbrev": "TINY-EP",
            "shards": 1,
            "source": "path",
            "path": str(tiny_manifest.parent / "hf"),
            "backend": "openai",
            "base_url": server.base_url,
            "served_model": "tiny",
            "max_model_len": 2048,
            "max_concurrency": 2,
        }
        job_server = {
            **{k: v for k, v in tiny.items() if k != "source"},
            "abbrev": "TINY-SRV",
            "shards": 1,
            "source": "path",
            "path": str(tiny_manifest.parent / "hf"),
            "backend": "vllm-server",
            "max_concurrency": 2,
        }
        imported = {
            "backend": "imported",
            "abbrev": "TINY-IMP",
            "hf_id": "procexec/tiny-llama",
            "lm_eval": [HARNESS_LOGS],
        }
        overlay = write_yaml(
            tmp_path / "endpoint.yaml",
            {
                "run_models": ["tiny-llama", "tiny-endpoint", "tiny-server", "tiny-imported"],
                "models": {"tiny-endpoint": endpoint, "tiny-server": job_server, "tiny-imported": imported},
            },
        )
        proc = snakemake(
            workdir,
            *LOCAL_RUN,
            "--show-failed-logs",
            "results/report/index.html",
            configfiles=[TINY, overlay],
        )
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
        out = proc.stdout + proc.stderr
        per_model = re.findall(r"^\s*wildcards: (.*model=[^,\n]+.*)$", out, flags=re.M)
        assert per_model and not [w for w in per_model if "model=tiny-llama" in w], per_model
        assert "localrule infer_endpoint:" in out  # endpoint jobs run on the submit host
        # the job's own server: started by the generation job, stopped with it, its log beside the job's
        server_logs = list((workdir / "logs" / "infer" / "tiny-server").glob("*.server.log"))
        assert server_logs and "vllm" in server_logs[0].read_text().splitlines()[0]
        results = workdir / "results"
        for dataset in yaml.safe_load(TINY.read_text())["suite"]["datasets"]:
            local = [o for _, o in read_jsonl(results / "generations" / "tiny-llama" / f"{dataset}.jsonl.gz")]
            remote = [o for _, o in read_jsonl(results / "generations" / "tiny-endpoint" / f"{dataset}.jsonl.gz")]
            assert [(o["id"], o["text"], o["token_ids"]) for o in local] == [
                (o["id"], o["text"], o["token_ids"]) for o in remote
            ]
            served = [o for _, o in read_jsonl(results / "generations" / "tiny-server" / f"{dataset}.jsonl.gz")]
            assert [(o["id"], o["text"], o["token_ids"]) for o in local] == [
                (o["id"], o["text"], o["token_ids"]) for o in served
            ]
            assert {o["provenance"]["backend"] for o in remote} == {"openai"}
            assert {o["provenance"]["backend"] for o in served} == {"vllm-server"}
            assert (results / "scores" / "tiny-endpoint" / f"{dataset}.parquet").exists()
            assert (results / "scores" / "tiny-server" / f"{dataset}.parquet").exists()
        metrics = pd.read_parquet(results / "aggregate" / "metrics.parquet")
        assert set(metrics["model"]) == {"tiny-llama", "tiny-endpoint", "tiny-server", "tiny-imported"}
        _check_imported(workdir, [TINY, overlay], job_stats(out), metrics, tmp_path / "by-hand")
        # no server outlives its job (the job's server ran in the workflow's directory; others may be other tests')
        servers = subprocess.run(
            ["pgrep", "-f", "procexec.engine.serve"], capture_output=True, text=True
        ).stdout.split()
        assert [pid for pid in servers if _cwd(pid) == workdir] == []
    finally:
        server.stop()


def _check_imported(workdir: Path, configs: list[Path], jobs: Counter, metrics: pd.DataFrame, by_hand: Path) -> None:
    """The imported model's one job, its scores as import-harness + score give them by hand, and the report."""
    from procexec.cli import main

    results = workdir / "results"
    assert jobs["import_harness"] == 1 and jobs["collect"] == 2  # the endpoint's and the job server's
    engine_side = {"models", "prompts", "infer", "prepare_model", "show_prompt", "check_model", "collect"}
    made = [p.relative_to(workdir) for p in workdir.rglob("*tiny-imported*")]
    assert Path("logs/import_harness/tiny-imported.log") in made and not [p for p in made if engine_side & set(p.parts)]
    logs = sorted(glob.glob(HARNESS_LOGS))
    config = ["--config", str(REPO / "config.yaml"), *map(str, configs)]
    assert main(["import-harness", "--lm-eval", *logs, *config, "--model", "tiny-imported", "--out", str(by_hand)]) == 0
    for dataset in yaml.safe_load(TINY.read_text())["suite"]["datasets"]:
        scored = by_hand / f"{dataset}.parquet"
        argv = ["score", "--generations", str(by_hand / f"{dataset}.jsonl.gz"), "--out", str(scored)]
        argv += ["--references", f"{results}/references/{dataset}.jsonl"]
        assert main([*argv, "--dataset", f"{results}/datasets/{dataset}.jsonl"]) == 0
        workflow_scores = pd.read_parquet(results / "scores" / "tiny-imported" / f"{dataset}.parquet")
        pd.testing.assert_frame_equal(workflow_scores, pd.read_parquet(scored))
    faa = metrics.set_index(["model", "grouping", "metric"]).loc[("tiny-imported", "overall", "faa"), "value"]
    assert faa == 0.5  # the scripted model answers index 0 of every cell right, index 1 wrong
    page = (results / "report" / "index.html").read_text()
    assert all(f'id="model-{key}"' in page for key in ("tiny-llama", "tiny-endpoint", "tiny-server", "tiny-imported"))
    assert page.count("not measured: evaluated elsewhere (lm-eval logs)") == 2  # provenance table, model section
    assert "evaluated elsewhere: generations read from lm-eval logs" in page
    assert f"<code>{logs[0]}</code>" in page and 'id="prompt-tiny-imported"' in page


def _second_model(tmp_path: Path, **changes) -> Path:
    model = dict(yaml.safe_load(TINY.read_text())["models"]["tiny-llama"])
    model.update(abbrev="TINY-B", shards=1, system_role=False, **changes)
    return write_yaml(
        tmp_path / "second-model.yaml",
        {"run_models": ["tiny-llama", "tiny-llama-b"], "models": {"tiny-llama-b": model}},
    )


@pytest.mark.vllm
def test_adding_a_model_reruns_only_that_model(tiny_run, tmp_path):
    workdir, wanted = tiny_run
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, _second_model(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    stats = job_stats(proc.stdout)
    n_datasets = len(yaml.safe_load(TINY.read_text())["suite"]["datasets"])
    expected = Counter(
        {
            "prepare_model": 1,
            "show_prompt": 1,
            "check_model": 1,
            "infer": 1,
            "collect": 1,
            "score": n_datasets,
            "aggregate": 1,
        }
    )
    if wanted == ["all"]:
        expected.update({"figures": 1, "tables": 1, "report": 1, "all": 1})
    assert stats == expected, proc.stdout[-4000:]
    # ... and every per-model job is the new model's
    per_model = re.findall(r"^\s*wildcards: (.*model=[^,\n]+.*)$", proc.stdout, flags=re.M)
    assert per_model and all("model=tiny-llama-b" in w for w in per_model), per_model


@pytest.mark.vllm
def test_a_model_outside_run_models_changes_nothing(tiny_run, tmp_path):
    workdir, wanted = tiny_run
    extra = _second_model(tmp_path)
    data = yaml.safe_load(extra.read_text())
    data["run_models"] = ["tiny-llama"]
    write_yaml(extra, data)
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, extra])
    assert proc.returncode == 0, proc.stderr
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.vllm
def test_changing_one_models_settings_reruns_only_that_model(tiny_run, tmp_path):
    workdir, wanted = tiny_run
    change = write_yaml(tmp_path / "change.yaml", {"models": {"tiny-llama": {"max_new_tokens": 16}}})
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, change])
    assert proc.returncode == 0, proc.stderr
    stats = job_stats(proc.stdout)
    cfg = yaml.safe_load(TINY.read_text())
    expected = Counter(
        {
            "infer": cfg["models"]["tiny-llama"]["shards"],  # no prepare_model: the weights did not change
            "collect": 1,  # no show_prompt: a budget does not change the prompt
            "score": len(cfg["suite"]["datasets"]),
            "aggregate": 1,
        }
    )
    if wanted == ["all"]:
        expected.update({"figures": 1, "tables": 1, "report": 1, "all": 1})
    assert stats == expected, proc.stdout[-4000:]
    assert "Params have changed" in proc.stdout


@pytest.mark.vllm
def test_changing_resources_reruns_no_job_but_the_report(tiny_run, tmp_path):
    """gpus and checkpoint size size the jobs; neither decides a generation."""
    workdir, wanted = tiny_run
    change = write_yaml(tmp_path / "resources.yaml", {"models": {"tiny-llama": {"gpus": 1, "checkpoint_gb": 3.0}}})
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, change])
    assert proc.returncode == 0, proc.stderr
    # the report multiplies wall time by gpus: it alone is made again
    expected = Counter({"report": 1, "all": 1}) if wanted == ["all"] else Counter()
    assert job_stats(proc.stdout) == expected, proc.stdout[-4000:]


@pytest.mark.vllm
def test_an_unrelated_config_key_reruns_nothing(tiny_run, tmp_path):
    """Site settings and another model's entry are read by nothing the tiny study produced."""
    workdir, wanted = tiny_run
    other = dict(yaml.safe_load(TINY.read_text())["models"]["tiny-llama"], abbrev="OTHER", max_new_tokens=3)
    change = write_yaml(
        tmp_path / "unrelated.yaml",
        {
            "cluster": {"cpus_per_gpu": 3, "min_mem_gb": 7, "max_runtime_minutes": 99},
            "models": {"not-run": other},
        },
    )
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, change])
    assert proc.returncode == 0, proc.stderr
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.vllm
def test_changing_the_suite_size_regenerates_data_but_keeps_models(tiny_run, tmp_path):
    workdir, wanted = tiny_run
    change = write_yaml(tmp_path / "suite.yaml", {"suite": {"examples_per_length": 3}})
    proc = snakemake(workdir, "-n", *wanted, configfiles=[TINY, change])
    assert proc.returncode == 0, proc.stderr
    stats = job_stats(proc.stdout)
    shards = yaml.safe_load(TINY.read_text())["models"]["tiny-llama"]["shards"]
    assert stats["generate"] == 2 and stats["execute"] == 2 and stats["infer"] == shards
    assert "prepare_model" not in stats


# ----------------------------------------------------------------------------- bad configs


# One case per path a refusal takes through the workflow (each message itself is unit-tested in
# test_config.py, test_study_stages.py and test_workflow_study.py): the schema, a cross-field rule, the budget.
BAD_CONFIGS = {
    "wrong-type": ({"suite": {"seed": "twelve"}}, "suite.seed"),
    "unknown-model-field": ({"models": {"tiny-llama": {"colour": "red"}}}, "models.tiny-llama"),
    "unknown-run-model": ({"run_models": ["no-such-model"]}, "run_models"),
    "over-budget": ({"cluster": {"gpu_hours_budget": 0.0001}}, "cluster.gpu_hours_budget"),
    "over-node-memory": ({"cluster": {"node_mem_gb": 16}}, "cluster.node_mem_gb 16"),
    # nested values (issue 30): vLLM's speculative methods, the guard the job would refuse at attempt 2
    "speculative-method": (
        {"models": {"tiny-llama": {"speculative_config": {"method": "ngram-fast", "num_speculative_tokens": 2}}}},
        "models.tiny-llama.speculative_config.method",
    ),
    "guard-min-over-max": (
        {"inference": {"rerun_repetition_guard": {"max_pattern_size": 4, "min_pattern_size": 8, "min_count": 3}}},
        "inference.rerun_repetition_guard.min_pattern_size",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_stops_before_any_job(case, tmp_path):
    patch, key = BAD_CONFIGS[case]
    workdir = tmp_path / "work"
    workdir.mkdir()
    bad = write_yaml(tmp_path / "bad.yaml", patch)
    proc = snakemake(workdir, "-n", configfiles=[TINY, bad])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert key in out, out[-3000:]
    assert "Building DAG" not in out
    assert not (workdir / "results").exists()
    if case == "unknown-model-field":
        assert "colour" in out


def test_an_impossible_unquoted_date_in_config_yaml_is_one_line(tmp_path):
    """Snakemake's own YAML loader raises (with frames) on ``template_date: 2026-13-45``; the preflight reads the
    workflow's config.yaml first and names the key (issue 30 item 3)."""
    flow = tmp_path / "flow"
    shutil.copytree(REPO / "rules", flow / "rules")
    shutil.copy(SNAKEFILE, flow / "Snakefile")
    text = (REPO / "config.yaml").read_text()
    (flow / "config.yaml").write_text(re.sub(r"(?m)^(\s*template_date:).*$", r"\1 2026-13-45", text, count=1))
    proc = subprocess.run(
        [venv_tool("snakemake"), "-s", str(flow / "Snakefile"), "-n", "--nocolor"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=workflow_env(),
        timeout=300,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and 'File "' not in err, err[-3000:]
    assert err.splitlines()[-1].startswith(
        f"procexec workflow: error: {flow / 'config.yaml'}: inference.template_date: "
        "'2026-13-45' is not a calendar date (month must be in 1..12"
    ), err


def _damaged_frame(store_dir: Path) -> tuple[Path, str]:
    segment = store_dir / "pilot-1-of-1.seg"
    data = bytearray(segment.read_bytes())
    data[40:60] = b"\xff" * 20
    segment.write_bytes(bytes(data))
    return segment, f"{segment.name}: "


def _index_of_a_newer_format(store_dir: Path) -> tuple[Path, str]:
    from procexec.generation.store import INDEX_MAGIC

    (index,) = store_dir.glob("pilot-1-of-1*.idx")
    data = bytearray(index.read_bytes())
    data[len(INDEX_MAGIC) : len(INDEX_MAGIC) + 2] = (99).to_bytes(2, "little")  # the header's format version
    index.write_bytes(bytes(data))
    return index, f"{index.name}: a store index of format 99; "


@pytest.mark.parametrize("damage", [_damaged_frame, _index_of_a_newer_format])
def test_a_damaged_pilot_store_stops_the_dag_build_in_one_line(tmp_path, damage):
    """The full stage sizes runtimes from the pilot's store; a damaged frame there was an exception with frames
    inside the runtime's input function, now the store's own one line, exit 2 (issue 30 item 3), as is an index
    a later procexec wrote (a format version unknown here), as procexec status says it.  The file stays as it was."""
    from procexec.generation.store import Store

    store_dir = tmp_path / "results" / "generations" / "tiny-llama" / "store"
    store = Store(store_dir, "pilot-1-of-1", commit_records=1)
    store.put(
        "0" * 64,
        {
            "id": "add_int_1-10_k1:5:0",
            "length": 5,
            "attempt": 1,
            "text": "t" * 20,
            "num_generated_tokens": 20,
            "finish_reason": "stop",
            "token_ids": list(range(20)),
            "token_offsets": list(range(20)),
            "provenance": {"loop": None},
        },
    )
    store.close()
    damaged, named = damage(store_dir)
    data = damaged.read_bytes()
    proc = snakemake(tmp_path, "-n", configfiles=[TINY])
    assert proc.returncode == 2 and 'File "' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"procexec workflow: error: results/generations/tiny-llama/store/{named}"), last
    assert damaged.read_bytes() == data


def test_a_dry_run_and_lint_write_nothing_of_ours(tmp_path):
    """Only Snakemake's own bookkeeping (.snakemake/) may appear: no results/, no merged config, no logs."""
    for args in (["-n"], ["--lint"]):
        workdir = tmp_path / args[0].strip("-")
        workdir.mkdir()
        proc = snakemake(workdir, *args)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert sorted(p.name for p in workdir.iterdir() if p.name != ".snakemake") == []


def test_empty_suite_stops_before_any_job(tmp_path):
    """A standalone config (no merge into config.yaml) whose suite has no family."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["suite"]["families"] = {}
    bad = write_yaml(tmp_path / "empty.yaml", cfg)
    proc = snakemake(workdir, "-n", "--replace-workflow-config", configfiles=[bad])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "suite.families" in out, out[-3000:]
    assert not (workdir / "results").exists()


# ----------------------------------------------------------------------------- static checks


def test_snakemake_lint_is_clean(tmp_path):
    proc = snakemake(tmp_path, "--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakefmt_check_is_clean():
    files = [str(SNAKEFILE), *map(str, sorted((REPO / "rules").glob("*.smk")))]
    proc = subprocess.run(
        [venv_tool("snakefmt"), "--check", *files], capture_output=True, text=True, env=workflow_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_rule_is_a_shell_rule_with_log_and_benchmark():
    """shell: rules compare their command text; script:/run: would rerun on code changes."""
    for path in sorted((REPO / "rules").glob("*.smk")):
        text = path.read_text()
        assert "script:" not in text and "\n    run:" not in text, path
        blocks = re.split(r"^rule ", text, flags=re.M)[1:]
        for block in blocks:
            name = block.split(":", 1)[0]
            for directive in ("log:", "benchmark:", "shell:", "conda:"):
                assert f"    {directive}" in block, f"{path.name}: rule {name} has no {directive}"


# ----------------------------------------------------------------------------- GPU leasing

FAKE_PROCEXEC = """#!/usr/bin/env bash
# Stand-in for procexec: writes each --out/--out-dir with the GPUs the command saw.
cmd=$1; shift
out=
while [ $# -gt 0 ]; do
    case $1 in --out) out=$2; shift ;; esac
    shift
done
mkdir -p "$(dirname "$out")"
echo "$cmd CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >"$out"
"""


@pytest.mark.parametrize("pool", [True, False], ids=["with-pool", "without-pool"])
def test_infer_leases_gpus_only_with_a_pool(pool, tmp_path):
    """The real infer rule, with a fake `procexec`: under PROCEXEC_GPU_POOL each job gets
    its model's number of GPU ids from workflow_scripts/gpu_lease.py; without it, none is set."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "procexec").write_text(FAKE_PROCEXEC)
    (fake_bin / "procexec").chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    overlay = write_yaml(
        tmp_path / "gpu.yaml",
        {
            "suite": {"lengths": [5], "examples_per_length": 1, "datasets": ["add_int_1-10_k1"]},
            "run_models": ["gpu2"],
            "models": {
                "gpu2": {
                    "abbrev": "G2",
                    "hf_id": "org/gpu2",
                    "gpus": 2,
                    "shards": 1,
                    "tensor_parallel_size": 2,
                    "max_model_len": 4096,
                },
            },
        },
    )
    extra = {"PATH": f"{fake_bin}{os.pathsep}{workflow_env()['PATH']}"}
    if pool:
        extra.update(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS="0,1,2,3")
    target = "results/generations/gpu2/shards/1-of-1.jsonl.gz"
    proc = snakemake(workdir, "--cores", "2", target, configfiles=[overlay], env=workflow_env(**extra))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = (workdir / target).read_text().split("CUDA_VISIBLE_DEVICES=")[1].strip()
    if pool:
        assert len(seen.split(",")) == 2 and set(seen.split(",")) <= {"0", "1", "2", "3"}, seen
    else:
        assert seen == "unset"


# ----------------------------------------------------------------------------- the full study


@pytest.fixture(scope="module")
def full_dry_run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("full")
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_full_study_dry_run_lists_its_jobs(full_dry_run):
    from procexec.benchmark.suite import expand_suite
    from procexec.cluster.layouts import load_planned

    cfg = load_planned([REPO / "config.yaml"])
    n_datasets = len(expand_suite(cfg.suite))
    run_models = cfg.run_models
    assert (n_datasets, len(run_models)) == (55, 15)
    expected = Counter(
        {
            "generate": n_datasets,
            "execute": n_datasets,
            "card": 1,
            "table4": 1,
            "prepare_model": len(run_models),
            "show_prompt": len(run_models),
            "check_model": len(run_models),
            "infer": sum(cfg.models[m].shards for m in run_models),
            "collect": len(run_models),
            "score": n_datasets * len(run_models),
            "aggregate": 1,
            "figures": 1,
            "tables": 1,
            "report": 1,
            "all": 1,
        }
    )
    assert job_stats(full_dry_run) == expected


def test_full_study_inference_jobs_ask_for_the_configured_gpus(full_dry_run):
    """gpu (and the SLURM gpu_model) come from each model's config entry."""
    from procexec.cluster.layouts import load_planned

    cfg = load_planned([REPO / "config.yaml"])
    models = cfg.models
    seen = 0
    for job in re.split(r"^\[[^\]\n]+\]$", full_dry_run, flags=re.M):
        if not re.search(r"^(local)?rule infer:", job.strip()):
            continue
        model = re.search(r"model=([^,\s]+)", job).group(1)
        resources = re.search(r"resources: (.*)", job).group(1)
        gpus = models[model].gpus
        assert f"gpu={gpus}" in resources, (model, resources)
        if gpus:
            assert "gpu_model=" in resources, (model, resources)
        seen += 1
    assert seen == sum(models[m].shards for m in cfg.run_models)

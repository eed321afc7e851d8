"""The pilot run both ways (``pilot_speculative``): config, workflow targets, figures, report, cost's acceptance."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from procexec.cli import main as procexec_main
from procexec.cluster.cost.measured import measured_acceptance
from procexec.cluster.cost.throughput import parallel_layout
from procexec.cluster.study_stages import SPECULATIVE_STORE, speculative_half, speculative_models
from procexec.cluster.workflow import Study
from procexec.config import prepare, read_yaml
from procexec.config.speculative import PILOT_NGRAM
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import EngineStats, add_stats, shard_stats, speculative_label
from procexec.generation.speculative import first_difference, pilot_figures, speculative_figures
from procexec.io.jsonl import read_jsonl, write_jsonl
from store_view import stored_keys

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw() -> dict:
    return read_yaml(REPO / "config.yaml")


def test_figures_count_identical_generations_and_where_the_others_first_differ():
    plain = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    drafted = [[1, 2, 3, 4], [5, 0, 7], [8, 9, 10]]  # one flipped token, one generation that went on
    figures = speculative_figures(
        plain,
        drafted,
        EngineStats(decoded_tokens=90, generate_s=3.0),
        EngineStats(decoded_tokens=100, generate_s=2.0, drafts=20, draft_tokens=80, accepted_tokens=40),
    )
    assert figures["identical"] == 1 and figures["identical_share"] == pytest.approx(1 / 3, abs=1e-3)
    assert figures["first_difference_at"] == [1, 2]
    assert figures["acceptance_rate"] == 0.5 and figures["mean_acceptance_length"] == 3.0
    assert (figures["plain_tok_s"], figures["speculative_tok_s"], figures["speed_ratio"]) == (30.0, 50.0, 1.667)
    assert first_difference([1, 2], [1, 2]) == 2
    # nothing drafted, nothing decoded: no rate is made up
    none = speculative_figures([[1]], [[1]], EngineStats(), EngineStats())
    assert none["acceptance_rate"] is None and none["speed_ratio"] is None and none["identical_share"] == 1.0


@pytest.mark.parametrize(
    "value, problem",
    [
        ("yes", "pilot_speculative.bool: 'yes' is not of type 'boolean'"),
        ({"method": "ngram-fast"}, "pilot_speculative.method: 'ngram-fast' is not a speculative method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "pilot_speculative.num_speculative_tokens: 0"),
        ({"num_speculative_tokens": 3}, "pilot_speculative: needs a 'method'"),
        ({"method": "ngram", "rejection_sample_method": "synthetic"}, "pilot_speculative.rejection_sample_method"),
    ],
)
def test_a_bad_pilot_speculative_is_one_line_naming_it(raw, value, problem):
    with pytest.raises(ProcexecError) as err:
        prepare({**copy.deepcopy(raw), "pilot_speculative": value})
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_pilot_runs_every_vllm_model_again_with_drafting_into_its_own_store(raw):
    """Store keys and rerun params of the plain half do not move; the speculative half is a target of the pilot
    alone, for the models that run vLLM in the job and do not speculate already."""
    plain = Study.from_config({**copy.deepcopy(raw), "stage": "pilot"})
    both = Study.from_config({**copy.deepcopy(raw), "stage": "pilot", "pilot_speculative": True})
    full = Study.from_config({**copy.deepcopy(raw), "pilot_speculative": True})
    assert plain.speculative_files() == [] and full.speculative_files() == []
    in_job = [m for m in both.run_models if both.models[m].runs_in_job and not both.models[m].speculative_config]
    assert both.speculative_models == in_job and len(in_job) > 0
    assert both.speculative_files() == [f"results/pilot/speculative/{m}.json" for m in in_job]
    model = in_job[0]
    assert both.model_settings(model) == plain.model_settings(model)
    assert both.speculative_shard_files(model) == [
        f"results/pilot/generations/{model}/speculative/shards/1-of-1.jsonl.gz"
    ]
    assert speculative_half(both.config, model).speculative_config == PILOT_NGRAM
    mine = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    stated = Study.from_config({**copy.deepcopy(raw), "stage": "pilot", "pilot_speculative": mine})
    assert speculative_half(stated.config, model).speculative_config == mine
    assert stated.speculative_settings(model) != both.speculative_settings(model)
    with pytest.raises(ProcexecError, match=f"--speculative: model '{model}' has no speculative half"):
        speculative_half(plain.config, model)
    drafting = copy.deepcopy(raw)
    drafting["models"][model]["speculative_config"] = mine
    assert model not in speculative_models(
        Study.from_config({**drafting, "stage": "pilot", "pilot_speculative": True}).config
    )


def test_drafter_runs_ds685s_own_mtp_module_in_the_pilot_and_n_gram_elsewhere(raw):
    """``pilot_speculative: drafter``: DS-685 drafts with its MTP module (vLLM 0.32's method ``mtp``; the recipe's
    3 tokens), measured both ways like the n-gram half; a model without a built-in drafter drafts n-gram (KK-1T's
    EAGLE3 head has weights of its own, which nothing stages)."""
    study = Study.from_config({**copy.deepcopy(raw), "stage": "pilot", "pilot_speculative": "drafter"})
    assert speculative_half(study.config, "ds-685").speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert speculative_half(study.config, "qw-4").speculative_config == PILOT_NGRAM
    assert speculative_half(study.config, "kk-1t").speculative_config == PILOT_NGRAM
    assert "ds-685" in study.speculative_models and study.speculative_settings("ds-685") != study.speculative_settings(
        "qw-4"
    )
    with pytest.raises(ProcexecError, match="pilot_speculative"):
        prepare({**copy.deepcopy(raw), "pilot_speculative": "mtp"})


def _shard(path: Path, model: str, ids: dict[tuple[str, int], list[int]], spec: dict | None) -> Path:
    """A shard file of generation records (the fields the comparison reads, as a job writes them)."""
    rows = []
    for (rid, attempt), tokens in ids.items():
        dataset, length, index = rid.split(":")
        rows.append(
            {
                "id": rid,
                "model": model,
                "dataset": dataset,
                "length": int(length),
                "index": int(index),
                "attempt": attempt,
                "text": "x" * len(tokens),
                "num_generated_tokens": len(tokens),
                "finish_reason": "stop",
                "token_ids": tokens,
                "prompt_sha256": "0" * 64,
                "provenance": {"engine": {"model": "m", **({"speculative_config": spec} if spec else {})}},
            }
        )
    write_jsonl(path, rows)
    return path


def test_the_pilot_figures_pair_both_halves_by_example_and_read_each_stores_pilot_rate(tmp_path):
    a, b = "add_int_1-10_k1:5:0", "add_int_1-10_k1:5:1"
    plain = _shard(tmp_path / "plain.jsonl.gz", "m", {(a, 1): [1, 2, 3], (b, 1): [4, 5], (b, 2): [6, 7]}, None)
    drafted = _shard(tmp_path / "spec.jsonl.gz", "m", {(b, 1): [4, 5], (b, 2): [6, 0], (a, 1): [1, 2, 3]}, PILOT_NGRAM)
    stores = tmp_path / "generations" / "m"
    add_stats(stores / "store", "pilot-1-of-1", EngineStats(decoded_tokens=100, generate_s=10.0))
    add_stats(stores / "store", "1-of-4", EngineStats(decoded_tokens=9000, generate_s=1.0))  # the full study's
    spec = EngineStats(decoded_tokens=100, generate_s=5.0, drafts=10, draft_tokens=40, accepted_tokens=30)
    add_stats(stores / SPECULATIVE_STORE, "pilot-1-of-1", spec)
    figures = pilot_figures("m", [plain], [drafted], stores / "store", stores / SPECULATIVE_STORE).model_dump()
    assert figures["model"] == "m" and figures["speculative_config"] == PILOT_NGRAM
    assert (figures["generations"], figures["identical"], figures["first_difference_at"]) == (2, 1, [3])
    assert (figures["plain_tok_s"], figures["speculative_tok_s"], figures["speed_ratio"]) == (10.0, 20.0, 2.0)
    assert figures["mean_acceptance_length"] == 4.0
    short = _shard(tmp_path / "short.jsonl.gz", "m", {(a, 1): [1, 2, 3]}, PILOT_NGRAM)
    with pytest.raises(ProcexecError, match=f"hold different examples \\(1, e.g. {b}\\)"):
        pilot_figures("m", [plain], [short], stores / "store", stores / SPECULATIVE_STORE)


def _figures(model: str = "qw-4", **changed) -> dict:
    figures = speculative_figures(
        [[1, 2, 3], [4, 5]],
        [[1, 2, 3], [4, 6]],
        EngineStats(decoded_tokens=50, generate_s=5.0),
        EngineStats(decoded_tokens=50, generate_s=4.0, drafts=10, draft_tokens=40, accepted_tokens=20),
    )
    return {"model": model, "speculative_config": PILOT_NGRAM, **figures, **changed}


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        ({"mean_acceptance_length": "fast"}, "mean_acceptance_length: Input should be a valid number"),
        ({"acceptance_rate": -0.5}, "acceptance_rate: Input should be greater than or equal to 0"),
        ({"identical": 9, "generations": 4}, "identical: 9 of 4 generations compared"),
        ({"identical_share": 2.25}, "identical_share: Input should be less than or equal to 1"),
        ({"identical_share": 0.9}, "identical_share: 0.9 is not 1 / 2"),
        ({"first_difference_at": []}, "first_difference_at: 0 positions for 1 generations that differ"),
        ({"accepted_tokens": 41}, "accepted_tokens: 41 of 40 drafted"),
        ({"model": None}, "model: Input should be a valid string"),
        ({"speed": 2.0}, "speed: Extra inputs are not permitted"),
    ],
)
def test_a_figures_file_is_checked_figure_by_figure(tmp_path, changed, problem):
    """Issue 38.3: the report rendered text where numbers belong (a template ValueError), a negative
    acceptance, 9 identical of 4, a share of 2.25; a null model beside another was a TypeError in the sort."""
    from procexec.generation.speculative import read_pilot_figures

    good, bad = tmp_path / "qw-4.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_figures()))
    bad.write_text(json.dumps({**_figures("gpt-oss-20b"), **changed}))
    with pytest.raises(ProcexecError) as refused:
        read_pilot_figures([good, bad], ["qw-4", "gpt-oss-20b"])
    assert str(refused.value).startswith(f"{bad}: not the figures of procexec speculative-pilot ({problem}")


def test_one_figures_file_per_model_the_config_runs(tmp_path):
    from procexec.generation.speculative import read_pilot_figures

    first, second, other = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for path, model in ((first, "qw-4"), (second, "qw-4"), (other, "no-such-model")):
        path.write_text(json.dumps(_figures(model)))
    assert [row["model"] for row in read_pilot_figures([first], ["qw-4"])] == ["qw-4"]
    with pytest.raises(ProcexecError, match=f"^{second}: a second file of model qw-4 \\(the first: {first}\\)$"):
        read_pilot_figures([first, second], ["qw-4"])
    with pytest.raises(ProcexecError, match=f"^{other}: the figures of model 'no-such-model', which the config"):
        read_pilot_figures([first, other], ["qw-4"])


def test_speculative_pilot_refuses_a_store_or_shards_with_nothing_to_compare(tmp_path, capsys):
    """A --speculative-store that named no folder, or shards without the model's records, reported
    'identical 0 of 0, speed x1.0' with exit 0."""
    a = "add_int_1-10_k1:5:0"
    plain = _shard(tmp_path / "plain.jsonl.gz", "m", {(a, 1): [1, 2, 3]}, None)
    drafted = _shard(tmp_path / "spec.jsonl.gz", "m", {(a, 1): [1, 2, 3]}, PILOT_NGRAM)
    empty = _shard(tmp_path / "empty.jsonl.gz", "m", {}, PILOT_NGRAM)
    stores = tmp_path / "generations" / "m"
    add_stats(stores / "store", "pilot-1-of-1", EngineStats(decoded_tokens=100, generate_s=10.0))
    add_stats(stores / "full-only", "1-of-1", EngineStats(decoded_tokens=100, generate_s=10.0))
    add_stats(stores / SPECULATIVE_STORE, "pilot-1-of-1", EngineStats(decoded_tokens=100, generate_s=5.0))
    out = tmp_path / "figures" / "m.json"

    def pilot(shards: Path, store: Path) -> int:
        argv = ["speculative-pilot", "--model", "m", "--plain", str(plain), "--speculative", str(shards)]
        argv += ["--plain-store", str(stores / "store"), "--speculative-store", str(store), "--out", str(out)]
        return procexec_main(argv)

    for shards, store, problem in [
        (drafted, tmp_path / "no-such-store", f"--speculative-store {tmp_path / 'no-such-store'}: is not a folder"),
        (drafted, stores / "full-only", "holds no engine statistics of the pilot"),
        (empty, stores / SPECULATIVE_STORE, f"--speculative {empty}: no record of model m to compare"),
    ]:
        assert pilot(shards, store) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and problem in err, err
        assert not out.exists()
    assert pilot(drafted, stores / SPECULATIVE_STORE) == 0
    assert json.loads(out.read_text())["identical"] == 1


def test_cost_projects_a_speculating_model_with_the_acceptance_the_pilot_measured(raw, tmp_path):
    """The pilot's drafts count for a model that drafts the same way (method and depth, as the statistics
    file records them); for another (MTP after an n-gram pilot) the stated acceptance stands, and the layout
    says what was measured and why it does not apply."""
    from procexec.cluster.cost.catalog import load_architecture

    store = tmp_path / "generations" / "ds-685" / "store"
    assert measured_acceptance(store) == {}
    ngram = speculative_label(PILOT_NGRAM)
    counted = EngineStats(drafts=10, draft_tokens=30, accepted_tokens=12, speculative=ngram)
    add_stats(store.parent / SPECULATIVE_STORE, "pilot-1-of-1", counted)
    assert measured_acceptance(store) == {ngram: pytest.approx(2.2)}
    catalog = load_architecture()
    ds = prepare(copy.deepcopy(raw)).models["ds-685"]

    def layouts(speculative_config: dict):
        model = ds.model_copy(update={"speculative_config": speculative_config})
        arch = catalog.models[model.abbrev]
        return (
            parallel_layout(model, arch, catalog.hardware),
            parallel_layout(model, arch, catalog.hardware, measured_acceptance(store)),
        )

    stated, measured = layouts(dict(PILOT_NGRAM))  # drafting as the pilot did
    assert measured.acceptance == pytest.approx(2.2) and "measured" in measured.speculative
    stated, measured = layouts({"method": "mtp", "num_speculative_tokens": 3})  # not as the pilot did
    assert measured.acceptance == stated.acceptance == pytest.approx(1 + 0.85 + 0.55 + 0.35)
    assert measured.speculative == f"MTP3 (a=2.75; measured with {ngram} only: not this method and depth)"
    (store.parent / SPECULATIVE_STORE / "stats" / "pilot-1-of-1.json").write_text("{}")
    with pytest.raises(ProcexecError, match="not a shard's engine statistics"):
        measured_acceptance(store)  # a measurement needs its files whole


def test_drafts_of_another_speculative_config_are_not_added_to_a_shards_figures(tmp_path):
    """A shard rerun with another speculative config: its file keeps the later run's drafts only (one
    acceptance is one method's); a file from before the config was recorded reads as not recorded."""
    store = tmp_path / "store"
    add_stats(store, "1-of-1", EngineStats(drafts=10, draft_tokens=40, accepted_tokens=10, speculative="ngram k=4"))
    add_stats(store, "1-of-1", EngineStats(drafts=5, draft_tokens=15, accepted_tokens=12, speculative="mtp k=3"))
    assert measured_acceptance(store / "x") == {}  # the store beside it is "x": nothing drafted there
    ((_, stats),) = shard_stats(store, warn=pytest.fail)
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens, stats.speculative) == (5, 15, 12, "mtp k=3")
    old = store / "stats" / "2-of-2.json"
    old.write_text(
        json.dumps({"decoded_tokens": 0, "generate_s": 0, "drafts": 4, "draft_tokens": 8, "accepted_tokens": 4})
    )
    assert {s.speculative for _, s in shard_stats(store, warn=pytest.fail)} == {"mtp k=3", ""}


def test_cost_measured_projects_with_the_measured_acceptance(raw):
    """``procexec cost --measured``'s projection (``project_model`` with what ``read_measured`` read): the
    layout says the acceptance was measured, and a lower one costs more GPU-hours than a higher one."""
    from procexec.cluster.cost.measured import Measured, MeasuredExample
    from procexec.cluster.cost.projection import project_model
    from procexec.cluster.layouts import planned

    drafting = copy.deepcopy(raw)
    drafting["models"]["ds-685"]["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 3}
    config = planned(prepare(drafting))

    def projected(acceptance: float | None):
        examples = {length: [MeasuredExample(3000, 0)] * 4 for length in config.suite.lengths}
        measured = Measured(
            examples,
            0,
            0,
            0,
            40,
            None,
            3000.0,
            acceptance_lengths={} if acceptance is None else {"mtp k=3": acceptance},
        )
        return project_model(config, "ds-685", 55, measured)

    stated, low, high = projected(None), projected(1.5), projected(3.5)
    assert "a=2.75)" in stated.layout and "a=1.50 measured" in low.layout and "a=3.50 measured" in high.layout
    assert low.gpu_hours > stated.gpu_hours > high.gpu_hours


@pytest.mark.vllm
def test_the_tiny_llama_pilot_both_ways_on_the_cpu_engine(tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path):
    """``procexec infer`` plain and ``--speculative`` (n-gram drafting on vLLM's CPU engine): the speculative
    half's records are keyed apart, its drafts are counted, and ``speculative-pilot`` compares the two."""
    raw = {**copy.deepcopy(tiny_raw_config), "stage": "pilot", "pilot_speculative": True, "run_models": ["tiny"]}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw, default=str))
    directory, ids = tiny_datasets
    stores = tmp_path / "generations" / "tiny"
    argv = ["infer", "--config", str(config), "--model", "tiny", "--datasets-dir", str(directory)]
    argv += ["--datasets", *ids, "--manifest", str(tiny_manifest), "--no-progress"]
    assert procexec_main([*argv, "--store", str(stores / "store"), "--out", str(tmp_path / "plain.jsonl.gz")]) == 0
    # as a job runs it: a process of its own (the n-gram drafter imports numba, which a later CPU worker of
    # this test process would trip over: tests/preparation/test_check_model.py's numba_left_behind)
    argv += [
        "--speculative",
        "--store",
        str(stores / SPECULATIVE_STORE),
        "--out",
        str(tmp_path / "speculative.jsonl.gz"),
    ]
    job = subprocess.run([sys.executable, "-m", "procexec.cli", *argv], capture_output=True, text=True)
    assert job.returncode == 0, job.stderr[-2000:]
    assert not set(stored_keys(stores / "store")) & set(stored_keys(stores / SPECULATIVE_STORE))  # keyed apart
    drafted = [obj for _, obj in read_jsonl(tmp_path / "speculative.jsonl.gz")]
    assert all(obj["provenance"]["engine"]["speculative_config"] == PILOT_NGRAM for obj in drafted)
    # the shard's figures say what drafted (cost --measured applies them to a model drafting the same way only)
    ((_, counted),) = shard_stats(stores / SPECULATIVE_STORE, warn=pytest.fail)
    assert counted.drafts > 0 and counted.speculative == speculative_label(PILOT_NGRAM)
    out = tmp_path / "speculative" / "tiny.json"
    argv = ["speculative-pilot", "--model", "tiny", "--plain", str(tmp_path / "plain.jsonl.gz")]
    argv += ["--speculative", str(tmp_path / "speculative.jsonl.gz"), "--out", str(out)]
    argv += ["--plain-store", str(stores / "store"), "--speculative-store", str(stores / SPECULATIVE_STORE)]
    assert procexec_main(argv) == 0
    figures = json.loads(out.read_text())
    assert figures["generations"] == len(drafted) == 8 and figures["speculative_config"] == PILOT_NGRAM
    assert figures["drafts"] > 0 and figures["mean_acceptance_length"] > 1.0  # the engine's own counters
    assert figures["identical"] == 8  # greedy ids on the CPU engine, as bench_speculative measured
    assert figures["plain_tok_s"] > 0 and figures["speculative_tok_s"] > 0

"""The hardware catalog and each model's layout on it (procexec.config.hardware, .layouts, .plan; procexec plan).

The plans for the four catalog GPUs are held by properties, not by their numbers: every layout fits by the
capacity model (recomputed here from architecture.yaml and hardware.yaml through procexec.engine.capacity) and
holds the recipe's minimum, none is wider than it must be, the frontier models span nodes where one node holds
too little, and on an H200 the planner gives the layouts the study ran with (the same store keys).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from procexec.cli import main
from procexec.cluster.cost.catalog import load_architecture
from procexec.cluster.layouts import load_recipes, planned
from procexec.cluster.workflow import Study
from procexec.config import prepare, read_yaml
from procexec.config.hardware import load_catalog
from procexec.config.keys import output_settings
from procexec.engine.capacity import KvFootprint, ParallelShape, capacity

REPO = Path(__file__).resolve().parents[2]
CATALOG = ("h200", "h100", "a100", "b200")
FRONTIER = ("DS-685", "KK-1T")
#: The layouts the study ran with on H200 nodes before they were planned (config.yaml's gpus,
#: tensor_parallel_size and data-parallel serve_args; docs/models.md): (GPUs, TP, DP, EP).
SHIPPED_H200 = {"ds-685": (8, 2, 4, True), "kk-1t": (8, 1, 8, True)}


@pytest.fixture(scope="module")
def raw() -> dict:
    return read_yaml(REPO / "config.yaml")


@pytest.fixture(scope="module")
def plans(raw) -> dict[str, dict]:
    """``procexec plan --json`` for each catalog GPU (in this process: one config read each)."""
    out = {}
    for name in CATALOG:
        code, printed = _plan(["--hardware", name, "--json"])
        assert code == 0, printed
        out[name] = json.loads(printed)
    return out


def _plan(args: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["plan", "--config", str(REPO / "config.yaml"), *args])
    return code, buffer.getvalue()


def _fits_by_hand(abbrev: str, gpu_name: str, row: dict, max_context: int) -> int:
    """Sequences of ``max_context`` one engine holds, from the catalog's numbers and the capacity model alone."""
    arch = load_architecture().models[abbrev]
    gpu = load_catalog()[gpu_name]
    runtime = load_architecture().hardware
    tp, dp = row["tensor_parallel_size"], row["data_parallel_size"]
    overhead = runtime.runtime_overhead_bytes if arch.runtime_overhead_bytes is None else arch.runtime_overhead_bytes
    # KV per GPU: an MLA latent (and DeepSeek-V3.2's indexer) whole on each TP rank, a GQA cache split over them
    split = 1 if arch.kv_replicated else tp
    kv = KvFootprint(
        arch.kv_bytes_per_token / split + arch.indexer_bytes_per_token,
        arch.sliding_bytes_per_token / split,
        arch.sliding_window,
    )
    room = capacity(
        ParallelShape(tp, dp, row["expert_parallel"]),
        arch.weight_bytes,
        arch.expert_bytes,
        kv,
        gpu.memory_bytes,
        runtime.gpu_memory_utilization,
        reserved=overhead,
    )
    return room.per_engine(max_context)


def test_every_paper_model_gets_a_layout_that_fits_each_catalog_gpu(plans, raw):
    config = planned(prepare(copy.deepcopy(raw)))
    recipes = load_recipes()
    for name, report in plans.items():
        gpu = load_catalog()[name]
        assert report["hardware"] == name and report["gpu"]["memory_gb"] == gpu.memory_gb
        rows = {row["abbrev"]: row for row in report["models"]}
        assert len(rows) == 15 and report["fits"]
        for abbrev, row in rows.items():
            model = config.models[row["model"]]
            assert row["fits"] and not row["pinned"], (name, row["why"])
            # the capacity model, recomputed: at least one sequence of max_context per engine
            assert _fits_by_hand(abbrev, name, row, model.max_context) == row["sequences_at_max_context"] >= 1
            assert row["gpus"] == row["tensor_parallel_size"] * row["data_parallel_size"]
            assert row["nodes"] == math.ceil(row["gpus"] / gpu.gpus_per_node)
            assert row["tensor_parallel_size"] <= gpu.nvlink_domain
            recipe = recipes.get(abbrev)
            if recipe is not None:
                assert row["gpus"] * gpu.memory_gb >= recipe.vram_minimum_gb, (name, abbrev)
            if row["expert_parallel"]:  # data + expert parallel over whole nodes, the recipe's TP
                assert row["gpus"] == row["nodes"] * gpu.gpus_per_node
                assert row["tensor_parallel_size"] == recipe.rank_tp(gpu)
                assert row["data_parallel_size_local"] * row["nodes"] == row["data_parallel_size"]
            assert row["gpu_hours"] > 0 and row["paper_gpu_hours"] > 0
            assert row["sequences_at_mean_context"] >= row["sequences_at_max_context"]


def test_no_layout_is_wider_than_it_must_be(plans, raw):
    """The fewest GPUs: half the tensor parallel of a one-engine layout, or one node fewer of a data-parallel
    one, does not fit (or holds less than the recipe's minimum)."""
    config = planned(prepare(copy.deepcopy(raw)))
    for name, report in plans.items():
        gpu = load_catalog()[name]
        for row in report["models"]:
            if row["gpus"] == 1:
                continue
            smaller = dict(row)
            if row["expert_parallel"]:
                smaller["data_parallel_size"] = (
                    row["data_parallel_size"] - gpu.gpus_per_node // row["tensor_parallel_size"]
                )
            else:
                smaller["tensor_parallel_size"] = row["tensor_parallel_size"] // 2
            model = config.models[row["model"]]
            gpus = smaller["tensor_parallel_size"] * smaller["data_parallel_size"]
            minimum = load_recipes().get(row["abbrev"])
            too_small = minimum is not None and gpus * gpu.memory_gb < minimum.vram_minimum_gb
            assert too_small or _fits_by_hand(row["abbrev"], name, smaller, model.max_context) < 1, (name, row)


def test_the_frontier_models_span_nodes_where_one_holds_too_little(plans):
    for name in ("h100", "a100"):
        rows = {row["abbrev"]: row for row in plans[name]["models"]}
        for abbrev in FRONTIER:
            assert rows[abbrev]["nodes"] >= 2 and rows[abbrev]["expert_parallel"], (name, rows[abbrev])
    for name in ("h200", "b200"):
        assert all(row["nodes"] == 1 for row in plans[name]["models"])


def test_on_h200_the_planner_gives_the_layouts_the_study_ran_with(plans, raw):
    """Today's layouts, and so today's store keys: the planned config keys every model as the config that
    pinned them did (its gpus, tensor_parallel_size and serve_args written out)."""
    rows = {row["model"]: row for row in plans["h200"]["models"]}
    for key, row in rows.items():
        shipped = SHIPPED_H200.get(key, (1, 1, 1, False))
        assert (row["gpus"], row["tensor_parallel_size"], row["data_parallel_size"], row["expert_parallel"]) == shipped
    pinned = copy.deepcopy(raw)
    for key, (gpus, tp, dp, _) in SHIPPED_H200.items():
        pinned["models"][key].update(
            gpus=gpus, tensor_parallel_size=tp, serve_args=["--data-parallel-size", str(dp), "--enable-expert-parallel"]
        )
    for key in rows:
        pinned["models"][key].setdefault("gpus", 1)
        pinned["models"][key].setdefault("tensor_parallel_size", 1)
    derived, written = planned(prepare(copy.deepcopy(raw))), planned(prepare(pinned))
    for key in rows:
        assert output_settings(derived.models[key], derived.inference) == output_settings(
            written.models[key], written.inference
        ), key
        assert written.plans[key].pinned and not derived.plans[key].pinned


def test_a100_has_no_kernels_for_deepseek_v32_and_the_workflow_refuses_it(plans, raw):
    rows = {row["abbrev"]: row for row in plans["a100"]["models"]}
    assert not rows["DS-685"]["runs"] and "compute capability 8.0" in rows["DS-685"]["why"]
    assert all(row["runs"] for abbrev, row in rows.items() if abbrev != "DS-685")
    on_a100 = copy.deepcopy(raw)
    on_a100["cluster"]["hardware"] = "a100"
    refusal = Study.from_config(on_a100).kernel_refusal()
    assert refusal.startswith("models.ds-685: vLLM 0.32 has no kernels for DS-685") and "\n" not in refusal
    assert Study.from_config(copy.deepcopy(raw)).kernel_refusal() is None


def test_a_site_states_its_own_gpu_and_its_gres_type(raw):
    """cluster.hardware as a mapping: the planner and the profile read it as a catalog entry."""
    site = copy.deepcopy(raw)
    site["cluster"]["hardware"] = {
        "name": "site GPU 96 GB",
        "gres_type": "gh96",
        "compute_capability": "9.0",
        "memory_gb": 96,
        "hbm_tb_per_s": 4.0,
        "bf16_dense_tflops": 989.5,
        "gpus_per_node": 4,
        "nvlink_domain": 4,
    }
    study = Study.from_config(site)
    assert study.gpu_type("qw-4") == "gh96" and study.layout("qw-4").gpus == 1
    assert study.nodes("ds-685") >= 2 and study.gres("ds-685") == f"gpu:gh96:{study.node_gpus('ds-685')}"
    site["cluster"]["gpu_type"] = None  # the site names no GRES type: --gpus=N
    assert Study.from_config(site).gpu_type("qw-4") == ""
    site["cluster"]["hardware"] = {**site["cluster"]["hardware"], "memory_gb": "96 GB"}
    with pytest.raises(Exception, match=r"cluster\.hardware\.memory_gb: .*'96 GB'"):
        prepare(site, "config.yaml")


def test_an_unknown_hardware_is_one_line(raw, capsys):
    bad = copy.deepcopy(raw)
    bad["cluster"]["hardware"] = "h300"
    with pytest.raises(Exception, match=r"cluster\.hardware: 'h300' is not in the catalog \(h200, h100, a100, b200"):
        prepare(bad, "config.yaml")
    assert main(["plan", "--config", str(REPO / "config.yaml"), "--hardware", "h300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("procexec plan: error: --hardware 'h300': not in the catalog") and "\n" not in err


def test_the_plan_table_names_each_model_and_the_total(capsys):
    code, printed = _plan(["--hardware", "h100"])
    assert code == 0
    lines = printed.splitlines()
    assert lines[0].startswith("h100: NVIDIA H100 SXM 80GB, 80 GB at 3.35 TB/s, 8 per node")
    config = read_yaml(REPO / "config.yaml")
    assert [line.split()[0] for line in lines[2:17]] == [
        config["models"][key]["abbrev"] for key in config["run_models"]
    ]
    ds = next(line for line in lines if line.startswith("DS-685"))
    assert " nodes " in ds and ds.split()[-1] == "yes"
    assert any(line.startswith("all: ") and "H100 GPU-hours" in line for line in lines)

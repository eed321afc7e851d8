"""Synthetic inputs for the figures / tables / report tests and benchmark.

``synthetic_scores`` follows the per-example score-column contract of
docs/interfaces.md exactly, with accuracy falling with length so the figures have
shape, and is fast enough for the 825k-row benchmark; metrics come from the real
``procexec.analysis.aggregate``.  tests/analysis/test_report.py also builds an end-to-end fixture from the
real suite, executor, simulator and scorer.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd

from procexec.analysis.aggregate import aggregate
from procexec.records import INT_TEXT, OPERATORS
from procexec.scoring.score import SCORE_COLUMNS

RANGES = {"0-1": ("float",), "1-10": ("int", "float"), "10-100": ("int", "float")}


def dataset_ids(full: bool = True) -> list[str]:
    """The 55-dataset suite (or a 9-dataset slice that still has every operator, type, range, k)."""
    settings = [(t, r) for r, types in RANGES.items() for t in types]
    base = [f"{op}_{t}_{r}_k1" for t, r in settings for op in OPERATORS]
    look = [f"mixed_{t}_{r}_k{k}" for t, r in settings for k in range(2, 8)]
    if full:
        return base + look
    return [
        "add_int_1-10_k1",
        "sub_float_0-1_k1",
        "mul_int_10-100_k1",
        "div_float_1-10_k1",
        "mixed_float_10-100_k1",
        "mixed_int_1-10_k2",
        "mixed_float_0-1_k3",
        "mixed_int_10-100_k5",
        "mixed_float_1-10_k7",
    ]


def synthetic_scores(
    models: list[str], datasets: list[str], lengths: list[int], per_length: int, seed: int = 0
) -> pd.DataFrame:
    """Score rows for every (model, dataset, length, index), vectorised (825k rows in ~1 s)."""
    rng = np.random.default_rng(seed)
    grid = pd.MultiIndex.from_product(
        [models, datasets, lengths, range(per_length)], names=["model", "dataset", "length", "index"]
    ).to_frame(index=False)
    n = len(grid)
    parts = grid["dataset"].str.extract(
        r"^(?P<operator>[a-z]+)_(?P<input_type>[a-z]+)_(?P<input_range>[0-9-]+)_k(?P<lookback>\d+)$"
    )
    grid = pd.concat([grid, parts], axis=1)
    grid["lookback"] = grid["lookback"].astype(int)
    skill = grid["model"].map({m: 0.3 + 0.6 * i / max(len(models) - 1, 1) for i, m in enumerate(models)})
    p = skill * np.exp(-grid["length"] / 80) * np.where(grid["operator"].isin(["mul", "div"]), 0.7, 1.0)
    p = (p / (1 + 0.05 * (grid["lookback"] - 1))).to_numpy()
    faa = rng.random(n) < p
    caa = faa | (rng.random(n) < 0.01)
    parseable = faa | (rng.random(n) < 0.85 - grid["length"].to_numpy() / 400)
    log_mag = rng.normal(np.where(grid["operator"] == "mul", grid["length"] * 1.5, 2.0), 1.0)
    expected_float = np.sign(rng.random(n) - 0.3) * 10.0 ** np.minimum(log_mag, 300)
    expected_float[log_mag > 300] = np.nan  # beyond float range: exact text only
    expected = [
        ("1" + "0" * int(m)) if np.isnan(v) else repr(round(float(v), 3)) for v, m in zip(expected_float, log_mag)
    ]
    steps = np.where(
        rng.random(n) < 0.7 - grid["length"] / 300, grid["length"], (grid["length"] * rng.random(n)).astype(int)
    )
    steps = np.where(rng.random(n) < 0.03, grid["length"] + 1, steps)
    diverge = np.where(faa, -1, (rng.random(n) * grid["length"]).astype(int) + 1)
    errors = rng.multinomial(3, [0.4, 0.3, 0.1, 0.2], size=n) * (~faa)[:, None]
    truncated = rng.random(n) < grid["length"] / 2000
    tokens = (grid["length"] * rng.uniform(20, 60, n)).astype(int)
    position = np.where(parseable, rng.uniform(0, 100, n), np.nan)
    frame = pd.DataFrame(
        {
            "id": grid["dataset"] + ":" + grid["length"].astype(str) + ":" + grid["index"].astype(str),
            "model": grid["model"],
            "dataset": grid["dataset"],
            "length": grid["length"],
            "index": grid["index"],
            "input_type": grid["input_type"],
            "input_range": grid["input_range"],
            "operator": grid["operator"],
            "lookback": grid["lookback"],
            "attempt": np.where(truncated, 2, 1),
            "expected": expected,
            "expected_float": expected_float,
            "expected_log10_abs": log_mag,
            "faa": faa,
            "caa": caa,
            "parseable": parseable,
            "n_answers": parseable.astype(int) + (rng.random(n) < 0.1),
            "n_parseable": parseable.astype(int),
            "first_answer_raw": np.where(parseable, "42", None),
            "first_answer_value": np.where(parseable, "42", None),
            "answer_position": position,
            "answer_position_basis": np.where(parseable, "tokens", None),
            "steps_generated": steps,
            "step_following": np.select([steps < grid["length"], steps == grid["length"]], ["under", "exact"], "over"),
            "tolerance_match": faa | (rng.random(n) < 0.05),
            "truncated": truncated,
            "finish_reason": np.where(truncated, "length", "stop"),
            "num_generated_tokens": tokens,
            "first_divergent_step": pd.array(np.where(diverge < 0, None, diverge), dtype="Int64"),
            "correct_prefix": np.where(faa, grid["length"], np.maximum(diverge - 1, 0)),
            "n_claims": steps,
            "n_arithmetic_slip": errors[:, 0],
            "n_wrong_operand": errors[:, 1],
            "n_skipped": errors[:, 2],
            "n_propagation": errors[:, 3],
            "first_error_class": np.where(faa, None, "arithmetic_slip"),
            # no claim to point at in write_generations' text: every divergent step reads as skipped there
            "divergent_claim": None,
            "divergent_claim_start": pd.array([None] * n, dtype="Int64"),
            "divergent_claim_end": pd.array([None] * n, dtype="Int64"),
            "answer_matches_last_claim": pd.array(np.where(parseable, faa, None), dtype="boolean"),
            "looping": truncated & (rng.random(n) < 0.2),
        }
    )
    frame["loop_period"] = pd.array(np.where(frame["looping"], 37, None), dtype="Int64")
    assert list(frame.columns) == list(SCORE_COLUMNS)
    return frame


def write_aggregate(scores: pd.DataFrame, aggregate_dir: Path, resamples: int = 20) -> None:
    """What ``procexec aggregate`` writes, via the real aggregation (few resamples: speed)."""
    aggregate_dir.mkdir(parents=True, exist_ok=True)
    scores.to_parquet(aggregate_dir / "scores.parquet", index=False)
    metrics = aggregate(scores, resamples=resamples, seed=0)
    metrics.to_parquet(aggregate_dir / "metrics.parquet", index=False)
    metrics.to_csv(aggregate_dir / "metrics.csv", index=False)


def write_references(scores: pd.DataFrame, references_dir: Path) -> None:
    """One Reference line per example of the first model, finals taken from ``expected``."""
    references_dir.mkdir(parents=True, exist_ok=True)
    first = scores[scores["model"] == scores["model"].iloc[0]]
    for dataset, rows in first.groupby("dataset"):
        with open(references_dir / f"{dataset}.jsonl", "w") as handle:
            for row in rows.itertuples():
                trace = ["3", "4"] + [str(j) for j in range(7, 7 + row.length)]
                trace[-1] = row.expected
                handle.write(
                    json.dumps(
                        {
                            "id": row.id,
                            "dataset": dataset,
                            "length": int(row.length),
                            "index": int(row.index),
                            "semantics": "default",
                            "final": row.expected,
                            "final_float": None if np.isnan(row.expected_float) else float(row.expected_float),
                            "final_type": "int" if INT_TEXT.fullmatch(row.expected) else "float",
                            "trace": trace,
                            "edge_cases": [],
                            "appendix_a_final": row.expected,
                            "appendix_a_disagrees": False,
                        }
                    )
                    + "\n"
                )


XSS_TEXT = (
    "Step 1: S3 = 7 <script>document.title='pwned-script'; window.__pwned = 1;</script>\n"
    "<img src=x onerror=\"document.title='pwned-img'; window.__pwned = 2;\">\n"
    "<answer>42</answer>"
)


def write_generations(scores: pd.DataFrame, generations_dir: Path, text: str = XSS_TEXT) -> None:
    """A GenerationRecord per score row for the datasets present, with a hostile text."""
    for (model, dataset), rows in scores.groupby(["model", "dataset"]):
        path = generations_dir / model / f"{dataset}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as handle:
            for row in rows.itertuples():
                handle.write(
                    json.dumps(
                        {
                            "id": row.id,
                            "model": model,
                            "dataset": dataset,
                            "length": int(row.length),
                            "index": int(row.index),
                            "attempt": int(row.attempt),
                            "text": text,
                            "num_generated_tokens": int(row.num_generated_tokens),
                            "finish_reason": row.finish_reason,
                        }
                    )
                    + "\n"
                )


def write_benchmarks(models: list[str], benchmarks_dir: Path, shards: int = 2) -> None:
    """Snakemake benchmark TSVs: benchmarks/infer/{model}/{shard}.tsv, 1800 s each."""
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for model in models:
        for shard in range(shards):
            path = benchmarks_dir / "infer" / model / f"{shard}-of-{shards}.tsv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(header + "1800.0\t0:30:00\t100\t200\t90\t95\t1.0\t2.0\t50.0\t900.0\n")


REPORT_MODELS = ["ds-1.5", "qw-4", "kk-1t"]  # kk-1t stays without scores: the report must say so
REPORT_DATASETS = ["add_int_1-10_k1", "mul_float_0-1_k1", "mixed_float_10-100_k1", "mixed_int_1-10_k3"]


def build_pipeline(root: Path, repo: Path) -> dict[str, Path]:
    """The real suite -> executor -> simulator -> scorer -> aggregate chain, then figures, tables, report.

    Two models get simulated generations (one with a hostile text); the third has none.
    """
    import dataclasses

    import yaml

    from procexec import config as config_mod
    from procexec.benchmark.executor import execute
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.cli import main as cli
    from procexec.io.jsonl import write_jsonl
    from procexec.io.parquet import write_parquet
    from procexec.scoring.files import score_file
    from procexec.scoring.simulator import simulate

    raw = yaml.safe_load((repo / "config.yaml").read_text())
    raw["run_models"] = REPORT_MODELS
    raw["suite"].update(datasets=REPORT_DATASETS, lengths=[5, 15], examples_per_length=4)
    paths = {
        name: root / name
        for name in ("datasets", "references", "generations", "scores", "aggregate", "figures", "tables", "benchmarks")
    }
    paths["config"] = root / "config.yaml"
    paths["config"].write_text(yaml.safe_dump(raw))
    config = config_mod.load(paths["config"])
    score_files = []
    for dataset in REPORT_DATASETS:
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5, 15], 4, config.suite.seed)
        refs = [execute(e) for e in examples]
        write_jsonl(paths["datasets"] / f"{dataset}.jsonl", (e.to_json() for e in examples))
        write_jsonl(paths["references"] / f"{dataset}.jsonl", (r.to_json() for r in refs))
        for s, model in enumerate(REPORT_MODELS[:2]):
            gens = [
                dataclasses.replace(simulate(e, r, seed=s, target_chars=600), model=model)
                for e, r in zip(examples, refs)
            ]
            if model == REPORT_MODELS[0]:
                gens = [
                    dataclasses.replace(g, text=XSS_TEXT + "\n" + g.text, token_ids=None, token_offsets=None)
                    for g in gens
                ]
            gen_path = paths["generations"] / model / f"{dataset}.jsonl.gz"
            write_jsonl(gen_path, (g.to_json() for g in gens))
            score_files.append(paths["scores"] / model / f"{dataset}.parquet")
            write_parquet(
                score_file(gen_path, paths["references"] / f"{dataset}.jsonl", paths["datasets"] / f"{dataset}.jsonl"),
                score_files[-1],
            )
    write_benchmarks(REPORT_MODELS[:2], paths["benchmarks"])
    common = ["--config", str(paths["config"]), "--aggregate-dir", str(paths["aggregate"])]
    references = ["--references-dir", str(paths["references"])]
    steps = [
        ["aggregate", "--scores", *map(str, score_files), "--out-dir", str(paths["aggregate"]), "--resamples", "50"],
        ["figures", *common, "--out-dir", str(paths["figures"])],
        ["tables", *common, *references, "--out-dir", str(paths["tables"])],
        [
            "report",
            *common,
            *references,
            "--figures-dir",
            str(paths["figures"]),
            "--tables-dir",
            str(paths["tables"]),
            "--generations-dir",
            str(paths["generations"]),
            "--benchmarks",
            *map(str, sorted(paths["benchmarks"].rglob("*.tsv"))),
            "--out",
            str(root / "report" / "index.html"),
        ],
    ]
    for argv in steps:
        assert cli(argv) == 0, argv
    paths["report"] = root / "report" / "index.html"
    return paths

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
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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


def _strings(values: Sequence[str | None], codes: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``values[codes]`` as a str column, taken in Arrow: pandas converts an object array row by row."""
    return pd.array(pa.array(values, type=pa.large_string()).take(codes.astype(np.int64)), dtype="str")


def _rounded_text(values: np.ndarray, log_mag: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``repr(round(v, 3))`` of each value; "1" and ``int(m)`` zeros where it is NaN (beyond float range).

    Below 1e6 in magnitude, round(v, 3) is the double nearest k / 1000 with k = rint(1000 v),
    unless 1000 v (off by at most |1000 v| 2^-53) lies too near a half to tell; with at most
    9 significant digits, its repr is k's digits with the point put in.  Python formats the rest.
    """
    scaled = values * 1000
    with np.errstate(invalid="ignore"):
        fast = (np.abs(values) < 1e6) & (np.abs(scaled - np.floor(scaled) - 0.5) > np.abs(scaled) * 2.0**-50)
    k = np.abs(np.rint(np.where(fast, scaled, 0.0))).astype(np.int64)
    fraction = pc.utf8_rtrim(pc.utf8_lpad(pa.array(k % 1000).cast(pa.string()), 3, "0"), "0")
    fraction = pc.if_else(pc.equal(fraction, ""), "0", fraction)
    unsigned = pc.binary_join_element_wise(pa.array(k // 1000).cast(pa.string()), fraction, ".")
    text = pc.binary_join_element_wise(pa.array(np.where(np.signbit(values), "-", "")), unsigned, "")
    slow = ~fast
    formatted = [
        "1" + "0" * int(m) if math.isnan(v) else repr(round(v, 3))
        for v, m in zip(values[slow].tolist(), log_mag[slow].tolist())
    ]
    return pd.array(pc.replace_with_mask(text, pa.array(slow), pa.array(formatted, type=pa.string())), dtype="str")


def synthetic_scores(
    models: list[str], datasets: list[str], lengths: list[int], per_length: int, seed: int = 0
) -> pd.DataFrame:
    """Score rows for every (model, dataset, length, index), vectorised (825k rows in ~1 s)."""
    rng = np.random.default_rng(seed)
    shape = (len(models), len(datasets), len(lengths), per_length)
    n = math.prod(shape)
    model_at, dataset_at, length_at, index = (axis.ravel() for axis in np.indices(shape))
    parts = pd.Series(datasets, dtype=object).str.extract(
        r"^(?P<operator>[a-z]+)_(?P<input_type>[a-z]+)_(?P<input_range>[0-9-]+)_k(?P<lookback>\d+)$"
    )
    length = np.asarray(lengths, dtype=np.int64)[length_at]
    operator = parts["operator"].to_numpy()[dataset_at]
    lookback = parts["lookback"].astype(np.int64).to_numpy()[dataset_at]
    skill = np.array([0.3 + 0.6 * i / max(len(models) - 1, 1) for i in range(len(models))])[model_at]
    p = skill * np.exp(-length / 80) * np.where(np.isin(operator, ["mul", "div"]), 0.7, 1.0)
    p = p / (1 + 0.05 * (lookback - 1))
    faa = rng.random(n) < p
    caa = faa | (rng.random(n) < 0.01)
    parseable = faa | (rng.random(n) < 0.85 - length / 400)
    log_mag = rng.normal(np.where(operator == "mul", length * 1.5, 2.0), 1.0)
    expected_float = np.sign(rng.random(n) - 0.3) * 10.0 ** np.minimum(log_mag, 300)
    expected_float[log_mag > 300] = np.nan  # beyond float range: exact text only
    steps = np.where(rng.random(n) < 0.7 - length / 300, length, (length * rng.random(n)).astype(int))
    steps = np.where(rng.random(n) < 0.03, length + 1, steps)
    diverge = np.where(faa, -1, (rng.random(n) * length).astype(int) + 1)
    errors = rng.multinomial(3, [0.4, 0.3, 0.1, 0.2], size=n) * (~faa)[:, None]
    truncated = rng.random(n) < length / 2000
    tokens = (length * rng.uniform(20, 60, n)).astype(int)
    position = np.where(parseable, rng.uniform(0, 100, n), np.nan)
    n_answers = parseable.astype(int) + (rng.random(n) < 0.1)
    tolerance_match = faa | (rng.random(n) < 0.05)
    looping = truncated & (rng.random(n) < 0.2)
    example = (dataset_at * len(lengths) + length_at) * per_length + index
    ids = [f"{d}:{size}:{i}" for d in datasets for size in lengths for i in range(per_length)]
    frame = pd.DataFrame(
        {
            "id": _strings(ids, example),
            "model": _strings(models, model_at),
            "dataset": _strings(datasets, dataset_at),
            "length": length,
            "index": index,
            "input_type": _strings(list(parts["input_type"]), dataset_at),
            "input_range": _strings(list(parts["input_range"]), dataset_at),
            "operator": _strings(list(parts["operator"]), dataset_at),
            "lookback": lookback,
            "attempt": np.where(truncated, 2, 1),
            "expected": _rounded_text(expected_float, log_mag),
            "expected_float": expected_float,
            "expected_log10_abs": log_mag,
            "faa": faa,
            "caa": caa,
            "parseable": parseable,
            "n_answers": n_answers,
            "n_parseable": parseable.astype(int),
            "first_answer_raw": _strings([None, "42"], parseable),
            "first_answer_value": _strings([None, "42"], parseable),
            "answer_position": position,
            "answer_position_basis": _strings([None, "tokens"], parseable),
            "steps_generated": steps,
            "step_following": _strings(["under", "exact", "over"], np.sign(steps - length) + 1),
            "tolerance_match": tolerance_match,
            "truncated": truncated,
            "finish_reason": _strings(["stop", "length"], truncated),
            "num_generated_tokens": tokens,
            "first_divergent_step": pd.arrays.IntegerArray(np.maximum(diverge, 0), diverge < 0),
            "correct_prefix": np.where(faa, length, np.maximum(diverge - 1, 0)),
            "n_claims": steps,
            "n_arithmetic_slip": errors[:, 0],
            "n_wrong_operand": errors[:, 1],
            "n_skipped": errors[:, 2],
            "n_propagation": errors[:, 3],
            "first_error_class": _strings(["arithmetic_slip", None], faa),
            # no claim to point at in write_generations' text: every divergent step reads as skipped there
            "divergent_claim": None,
            "divergent_claim_start": pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)),
            "divergent_claim_end": pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)),
            "answer_matches_last_claim": pd.arrays.BooleanArray(faa, ~parseable),
            "looping": looping,
            "loop_period": pd.arrays.IntegerArray(np.full(n, 37), ~looping),
        }
    )
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

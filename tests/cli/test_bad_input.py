"""Every command fails cleanly on bad input (issue 15), tried as a hostile new user would.

Each case breaks one input of one command -- a truncated ``.gz``, plain text
named ``.gz``, non-UTF-8 bytes, a directory where a file is expected, an
unwritable output, junk parquet/CSV/manifest, a record field outside its
domain, an option outside its range, a config error -- and asserts:

* exit code 2;
* stderr is exactly one line, ``procexec CMD: error: ...``, naming the file
  (and line), the config key or the flag, and no traceback;
* the previous output (seeded before the run) is byte-identical afterwards;
* no temporary file or commit journal is left in any folder involved.

Inputs are small real files made in the test by the commands themselves
(generate, execute, simulate, collect, score, aggregate, figures, tables,
report), not a demo run.  The commands run in-process (an uncaught exception
would fail the test with its traceback); a few run as subprocesses to check the
real entry point, and the workflow's own config errors run through Snakemake.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cli_runs import procexec_in_process
from procexec.cli import main
from workflow_runs import dry_run

REPO = Path(__file__).resolve().parents[2]
DATASETS = ["add_int_1-10_k1", "mixed_float_0-1_k2"]
MODEL = "simulator"
UNWRITABLE = Path("/sys/procexec-test-unwritable")  # refused even to root (sysfs)


# ----------------------------------------------------------------------------- the world


def run(argv: list[str]) -> tuple[int, str]:
    """``procexec ARGV`` in-process (tests/cli_runs.py): (exit code, stderr)."""
    done = procexec_in_process(*argv)
    return done.returncode, done.stderr


def ok(argv: list[str]) -> None:
    code, err = run(argv)
    assert code == 0, (argv, err)


@dataclass
class World:
    """A complete little run: 2 datasets x 2 examples, simulated generations, every stage's output."""

    root: Path

    def __getattr__(self, name: str) -> Path:  # w.datasets, w.aggregate, w.figures, ...: folders of the run
        return self.root / "config.yaml" if name == "config" else self.root / name

    def dataset(self, i: int = 0) -> Path:
        return self.root / "datasets" / f"{DATASETS[i]}.jsonl"

    def refs(self, i: int = 0) -> Path:
        return self.root / "references" / f"{DATASETS[i]}.jsonl"

    def shard(self, i: int = 0) -> Path:
        return self.root / "shards" / f"{DATASETS[i]}.jsonl.gz"

    def gens(self, i: int = 0) -> Path:
        return self.root / "generations" / MODEL / f"{DATASETS[i]}.jsonl.gz"

    def scores(self, i: int = 0) -> Path:
        return self.root / "scores" / MODEL / f"{DATASETS[i]}.parquet"


def world_config() -> dict:
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["suite"].update(seed=1, lengths=[5], examples_per_length=2, datasets=DATASETS)
    raw["models"][MODEL] = {
        "abbrev": "SIM",
        "hf_id": "procexec/simulator",
        "group": "others",
        "gpus": 0,
        "shards": 1,
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
    }
    raw["run_models"] = [MODEL]
    return raw


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    w = World(tmp_path_factory.mktemp("world"))
    w.config.write_text(yaml.safe_dump(world_config(), sort_keys=False))
    for i, dataset in enumerate(DATASETS):
        ok(["generate", "--config", w.config, "--dataset", dataset, "--out", w.dataset(i)])
        ok(["execute", "--in", w.dataset(i), "--out", w.refs(i)])
        ok(
            [
                "simulate",
                "--dataset",
                w.dataset(i),
                "--references",
                w.refs(i),
                "--out",
                w.shard(i),
                "--target-chars",
                "300",
                "--failure-rate",
                "0.7",
            ]
        )
    ok(
        [
            "collect",
            "--model",
            MODEL,
            "--shards",
            w.shard(0),
            w.shard(1),
            "--datasets-dir",
            w.datasets,
            "--datasets",
            *DATASETS,
            "--out-dir",
            w.gens(0).parent,
        ]
    )
    for i in range(len(DATASETS)):
        ok(
            [
                "score",
                "--generations",
                w.gens(i),
                "--references",
                w.refs(i),
                "--dataset",
                w.dataset(i),
                "--out",
                w.scores(i),
            ]
        )
    ok(["aggregate", "--scores", w.scores(0), w.scores(1), "--out-dir", w.aggregate, "--resamples", "20"])
    ok(
        [
            "figures",
            "--config",
            w.config,
            "--aggregate-dir",
            w.aggregate,
            "--out-dir",
            w.figures,
            "--workers",
            "1",
            "--dpi",
            "30",
        ]
    )
    ok(
        [
            "tables",
            "--config",
            w.config,
            "--aggregate-dir",
            w.aggregate,
            "--references-dir",
            w.references,
            "--out-dir",
            w.tables,
        ]
    )
    bench = w.benchmarks / "infer" / MODEL / "1-of-1.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\tmax_rss\n12.5\t0:00:12\t100\n")
    ok(report_argv(w, w.report))
    return w


def report_argv(w: World, out: Path, benchmarks_dir: Path | None = None, **changes: Path) -> list:
    """The report's command line; its benchmark files are the one shard's file under ``benchmarks_dir``."""
    dirs = {
        "--aggregate-dir": w.aggregate,
        "--figures-dir": w.figures,
        "--tables-dir": w.tables,
        "--generations-dir": w.generations,
        "--references-dir": w.references,
    }
    dirs.update({f"--{k.replace('_', '-')}": v for k, v in changes.items()})
    bench = (benchmarks_dir or w.benchmarks) / "infer" / MODEL / "1-of-1.tsv"
    return [
        "report",
        "--config",
        w.config,
        *[x for kv in dirs.items() for x in kv],
        "--benchmarks",
        bench,
        "--out",
        out,
    ]


# ----------------------------------------------------------------------------- bad files


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    return write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))


def edited(src: Path, dst: Path, line: int = 1, **fields) -> Path:
    """``src`` with fields of one record (1-based line) changed (None: removed), written to ``dst``."""
    lines = read_lines(src)
    record = json.loads(lines[line - 1])
    for name, value in fields.items():
        if value is None:
            record.pop(name)
        else:
            record[name] = value
    lines[line - 1] = json.dumps(record)
    return write_lines(dst, lines)


def replaced(src: Path, dst: Path, line: int, text: str) -> Path:
    lines = read_lines(src)
    lines[line - 1] = text
    return write_lines(dst, lines)


def with_bad_byte(src: Path, dst: Path, line: int) -> Path:
    raw = [s.encode() for s in read_lines(src)]
    raw[line - 1] = raw[line - 1].replace(b'"', b'"\xff', 1)
    return write_bytes(dst, b"".join(r + b"\n" for r in raw))


def truncated_gz(src: Path, dst: Path) -> Path:
    """``src`` gzip-compressed (unless it already is), cut in the middle."""
    data = src.read_bytes() if src.name.endswith(".gz") else gzip.compress(src.read_bytes())
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[: len(data) // 2])
    return dst


def plain_named_gz(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(read_lines(src)) + "\n")
    return dst


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def config_with(tmp: Path, text: str | bytes | None = None, **patch) -> Path:
    path = tmp / "cfg.yaml"
    if text is None:
        raw = world_config()
        for dotted, value in patch.items():
            *parents, last = dotted.split("__")
            node = raw
            for part in parents:
                node = node[part]
            node[last] = value
        text = yaml.safe_dump(raw, sort_keys=False)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def world_config_text() -> str:
    return yaml.safe_dump(world_config(), sort_keys=False)


def junk_parquet(path: Path, kind: str = "junk") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        path.write_text("id,model\na,b\n")
    elif kind == "columns":
        import pandas as pd

        pd.DataFrame({"a": [1], "b": ["x"]}).to_parquet(path)
    else:
        path.write_bytes(b"PAR1 not really \x00\x01 parquet")
    return path


def without_column(src: Path, dst: Path, column: str) -> Path:
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    pq.write_table(table.drop_columns([column]), dst)
    return dst


def speculative_figures_file(tmp: Path, **changed) -> Path:
    """The pilot's figures of the world's model as ``speculative-pilot --out`` writes them, ``changed``."""
    figures = {
        "model": MODEL, "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "generations": 2,
        "acceptance_rate": 0.5, "mean_acceptance_length": 3.0, "drafts": 10, "draft_tokens": 40,
        "accepted_tokens": 20, "plain_tok_s": 10.0, "speculative_tok_s": 12.5, "speed_ratio": 1.25,
        "identical": 1, "identical_share": 0.5, "first_difference_at": [1],
    }  # fmt: skip
    path = tmp / "figures.json"
    path.write_text(json.dumps({**figures, **changed}))
    return path


def lm_eval_sample_file(w: World, tmp: Path, doc: dict | None = None, **changed) -> Path:
    """One lm-eval sample of the world's first example, its row's ``doc`` and its own fields ``changed``."""
    from procexec.records import Example
    from procexec.release.rows import suite_row

    example = Example.from_json(json.loads(w.dataset(0).read_text().splitlines()[0]))
    row = {**suite_row(example), **(doc or {})}
    sample = {"doc_id": 0, "doc": row, "resps": [["<answer>1</answer>"]], **changed}
    path = tmp / "samples_procexec.jsonl"
    path.write_text(json.dumps(sample) + "\n")
    return path


# ----------------------------------------------------------------------------- cases


@dataclass
class Case:
    """``build(world, tmp)`` makes the bad input and returns the argv; ``message`` must match the line."""

    build: Callable[[World, Path], list]
    message: str  # regex, searched in the one error line ({tmp} is the case's folder)
    outputs: list[str] = field(default_factory=lambda: ["out"])  # names under tmp seeded with a previous output
    seed: Callable[[World, Path], None] | None = None  # seeds outputs (default: the bytes "previous\n")


def _seed_dir(source: str) -> Callable[[World, Path], None]:
    def seed(w: World, tmp: Path) -> None:
        shutil.copytree(getattr(w, source) if source != "gens" else w.gens(0).parent, tmp / "out")

    return seed


def _seed_file(make: Callable[[World], Path]) -> Callable[[World, Path], None]:
    def seed(w: World, tmp: Path) -> None:
        shutil.copy(make(w), tmp / "out")

    return seed


def gen(w: World, tmp: Path, *extra) -> list:
    return [
        "generate",
        "--dataset",
        DATASETS[0],
        "--seed",
        "1",
        "--lengths",
        "5",
        "--examples-per-length",
        "2",
        *extra,
        "--out",
        tmp / "out",
    ]


def gen_config(w: World, tmp: Path, config: Path, dataset: str = DATASETS[0]) -> list:
    return ["generate", "--config", config, "--dataset", dataset, "--out", tmp / "out"]


def execute(w: World, tmp: Path, data: Path) -> list:
    return ["execute", "--in", data, "--out", tmp / "out"]


def score(
    w: World,
    tmp: Path,
    gens: Path | None = None,
    refs: Path | None = None,
    dataset: Path | None = None,
    out: Path | None = None,
) -> list:
    return [
        "score",
        "--generations",
        gens or w.gens(0),
        "--references",
        refs or w.refs(0),
        "--dataset",
        dataset or w.dataset(0),
        "--out",
        out or tmp / "out",
    ]


def aggregate(w: World, tmp: Path, *scores, extra=(), out: Path | None = None) -> list:
    return ["aggregate", "--scores", *(scores or (w.scores(0), w.scores(1))), *extra, "--out-dir", out or tmp / "out"]


def simulate(w: World, tmp: Path, *extra, refs: Path | None = None) -> list:
    return ["simulate", "--dataset", w.dataset(0), "--references", refs or w.refs(0), *extra, "--out", tmp / "out"]


def figures(w: World, tmp: Path, aggregate_dir: Path | None = None, extra=()) -> list:
    return [
        "figures",
        "--config",
        w.config,
        "--aggregate-dir",
        aggregate_dir or w.aggregate,
        "--workers",
        "1",
        *extra,
        "--out-dir",
        tmp / "out",
    ]


def tables(
    w: World, tmp: Path, aggregate_dir: Path | None = None, references: Path | None = None, config: Path | None = None
) -> list:
    return [
        "tables",
        "--config",
        config or w.config,
        "--aggregate-dir",
        aggregate_dir or w.aggregate,
        "--references-dir",
        references or w.references,
        "--out-dir",
        tmp / "out",
    ]


def collect(w: World, tmp: Path, *shards, datasets_dir: Path | None = None) -> list:
    return [
        "collect",
        "--model",
        MODEL,
        "--shards",
        *(shards or (w.shard(0), w.shard(1))),
        "--datasets-dir",
        datasets_dir or w.datasets,
        "--datasets",
        *DATASETS,
        "--out-dir",
        tmp / "out",
    ]


def refs_dir_with(w: World, tmp: Path, line: int = 1, **fields) -> Path:
    directory = copy_dir(w.references, tmp / "refs")
    edited(w.refs(0), directory / w.refs(0).name, line, **fields)
    return directory


def aggregate_with(w: World, tmp: Path, name: str, make: Callable[[Path], object]) -> Path:
    directory = copy_dir(w.aggregate, tmp / "agg")
    (directory / name).unlink()
    make(directory / name)
    return directory


def gens_with(w: World, tmp: Path, line: int = 1, **fields) -> Path:
    return edited(w.gens(0), tmp / "g.jsonl.gz", line, **fields)


def reversed_offsets(w: World) -> list[int]:
    return list(reversed(json.loads(read_lines(w.gens(0))[0])["token_offsets"]))


def bad_procedure_line(w: World, tmp: Path) -> Path:
    record = json.loads(read_lines(w.dataset(0))[1])
    record["procedure"] = record["procedure"].replace("Step 2:", "Step 2 :")
    return replaced(w.dataset(0), tmp / "d.jsonl", 2, json.dumps(record))


def surrogate_procedure(w: World, tmp: Path) -> Path:
    record = json.loads(read_lines(w.dataset(0))[0])
    record["procedure"] = record["procedure"].replace("Step 1:", "Step \ud800:")
    return replaced(w.dataset(0), tmp / "d.jsonl", 1, json.dumps(record))  # ensure_ascii: a \ud800 escape


def shards_without_last_example_of_second(w: World, tmp: Path) -> list:
    second = write_lines(tmp / "s2.jsonl.gz", read_lines(w.shard(1))[:-1])
    return collect(w, tmp, w.shard(0), second)


def manifest_missing_file(w: World, tmp: Path) -> list:
    figs = copy_dir(w.figures, tmp / "figs")
    manifest = json.loads((figs / "manifest.json").read_text())
    drawn = next(f for f in manifest["figures"] if f["files"])
    (figs / drawn["files"][0]).unlink()
    return report_argv(w, tmp / "out", figures_dir=figs)


def tables_with(w: World, tmp: Path, name: str, data: bytes | None) -> list:
    directory = copy_dir(w.tables, tmp / "tabs")
    if data is None:
        (directory / name).unlink()
    else:
        (directory / name).write_bytes(data)
    return report_argv(w, tmp / "out", tables_dir=directory)


def benchmarks_with_junk(w: World, tmp: Path) -> list:
    directory = copy_dir(w.benchmarks, tmp / "bench")
    (directory / "infer" / MODEL / "1-of-1.tsv").write_text("not a benchmark\n1\n")
    return report_argv(w, tmp / "out", benchmarks_dir=directory)


def benchmarks_with(w: World, tmp: Path, text: str) -> Path:
    directory = copy_dir(w.benchmarks, tmp / "bench")
    (directory / "infer" / MODEL / "1-of-1.tsv").write_text(text)
    return directory


SHOWN = {
    "model": MODEL,
    "example": "add_int_1-10_k1:5:0",
    "commit": None,
    "tokenizer_mode": "auto",
    "template_kwargs": {},
    "route": "token ids",
    "system_folded": False,
    "text": "Procedure: ...",
    "decoded": "Procedure: ...",
    "prompt_tokens": 12,
    "sha256": "0" * 64,
}


def prompts_with(w: World, tmp: Path, shown: dict) -> list:
    """The report with a rendered-prompt file (``show-prompt --out``) of ``shown``."""
    (tmp / "prompts").mkdir()
    (tmp / "prompts" / f"{MODEL}.json").write_text(json.dumps(shown))
    return [*report_argv(w, tmp / "out"), "--prompts-dir", tmp / "prompts"]


def reproduction_with(w: World, tmp: Path, edit: Callable[[str], str]) -> list:
    """The report over tables whose reproduction.csv is ``edit``-ed (one of the workflow's intermediate files)."""
    directory = copy_dir(w.tables, tmp / "tabs")
    path = directory / "reproduction.csv"
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    return report_argv(w, tmp / "out", tables_dir=directory)


def _first_row_verdict(text: str, verdict: str) -> str:
    import csv

    rows = list(csv.reader(io.StringIO(text)))
    rows[1][rows[0].index("verdict")] = verdict
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _without_column(text: str, column: str) -> str:
    import csv

    rows = list(csv.reader(io.StringIO(text)))
    at = rows[0].index(column)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([r[:at] + r[at + 1 :] for r in rows])
    return out.getvalue()


def status_results(w: World, tmp: Path, bench: str | None) -> Path:
    """A results folder for ``procexec status`` (an empty store) with one benchmark file of ``bench``."""
    results = tmp / "results"
    (results / "generations").mkdir(parents=True)
    if bench is not None:
        path = results / "benchmarks" / "infer" / MODEL / "1-of-1.tsv"
        path.parent.mkdir(parents=True)
        path.write_text(bench)
    return results


def dup_key_config(tmp: Path) -> Path:
    text = world_config_text().replace("suite:\n", "suite:\n  seed: 7\n", 1)
    return config_with(tmp, text)


SEED_SCORE = _seed_file(lambda w: w.scores(0))
SEED_REPORT = _seed_file(lambda w: w.report)
SEED_REFS = _seed_file(lambda w: w.refs(0))

CASES: dict[str, Case] = {
    # --- generate: options, config files, output paths
    "generate-seed-negative": Case(
        lambda w, t: gen(w, t)[:3] + ["--seed", "-1"] + gen(w, t)[5:], r"--seed: -1 must be at least 0"
    ),
    "generate-lengths-zero": Case(lambda w, t: gen(w, t, "--lengths", "0"), r"--lengths"),
    "generate-lengths-arabic-indic": Case(lambda w, t: gen(w, t, "--lengths", "\u0665"), r"--lengths"),
    "generate-lengths-repeated": Case(lambda w, t: gen(w, t, "--lengths", "5,5"), r"--lengths.*repeated"),
    "generate-examples-zero": Case(lambda w, t: gen(w, t, "--examples-per-length", "0"), r"--examples-per-length"),
    "generate-unknown-dataset": Case(
        lambda w, t: [
            "generate",
            "--dataset",
            "pow_int_1-10_k1",
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "1",
            "--out",
            t / "out",
        ],
        r"unknown dataset id 'pow_int_1-10_k1'",
    ),
    "generate-k9-not-in-suite": Case(
        lambda w, t: gen_config(w, t, w.config, "add_int_1-10_k9") + ["--seed", "1"],
        r"add_int_1-10_k9.*not in the suite",
    ),
    "config-missing": Case(lambda w, t: gen_config(w, t, t / "nope.yaml"), r"nope\.yaml: configuration file not found"),
    "config-is-a-directory": Case(lambda w, t: gen_config(w, t, t), r"{tmp}: is a directory"),
    "config-not-utf8": Case(
        lambda w, t: gen_config(
            w, t, config_with(t, world_config_text().encode().replace(b"suite:\n", b"suite:\n  # caf\xe9\n", 1))
        ),
        r"cfg\.yaml: not UTF-8 text \(byte 0xe9 at line \d+\)",
    ),
    "config-yaml-syntax": Case(
        lambda w, t: gen_config(w, t, config_with(t, "suite:\n  seed: [1\n  lengths: 2\n")),
        r"cfg\.yaml:3:\d+: not valid YAML",
    ),
    "config-yaml-tab": Case(
        lambda w, t: gen_config(w, t, config_with(t, "suite:\n\tseed: 1\n")), r"cfg\.yaml:2:1: not valid YAML"
    ),
    "config-duplicate-key": Case(
        lambda w, t: gen_config(w, t, dup_key_config(t)), r"cfg\.yaml:\d+:\d+: .*'seed' appears twice"
    ),
    "config-duplicate-model": Case(
        lambda w, t: gen_config(w, t, config_with(t, world_config_text() + "models:\n  x: 1\n")),
        r"cfg\.yaml:\d+:1: .*'models' appears twice",
    ),
    "config-top-level-list": Case(
        lambda w, t: gen_config(w, t, config_with(t, "- 1\n- 2\n")), r"cfg\.yaml: expected a mapping"
    ),
    "config-schema-type": Case(lambda w, t: gen_config(w, t, config_with(t, suite__seed="abc")), r"suite\.seed"),
    "config-tp-on-cpu-model": Case(
        lambda w, t: gen_config(
            w, t, config_with(t, models__simulator={**world_config()["models"][MODEL], "tensor_parallel_size": 4})
        ),
        r"models\.simulator\.tensor_parallel_size",
    ),
    "config-unknown-run-model": Case(
        lambda w, t: gen_config(w, t, config_with(t, run_models=["gpt-9"])), r"run_models: unknown model key 'gpt-9'"
    ),
    "generate-out-under-a-file": Case(
        lambda w, t: gen(w, t)[:-1] + [write_bytes(t / "afile", b"x") / "x.jsonl"],
        r"afile/x\.jsonl: cannot write",
        outputs=["afile"],
    ),
    "generate-out-unwritable": Case(
        lambda w, t: gen(w, t)[:-1] + [UNWRITABLE / "x.jsonl"], r"cannot write", outputs=[]
    ),
    "generate-out-is-a-directory": Case(
        lambda w, t: gen(w, t)[:-1] + [t], r"{tmp}: cannot write \(is a directory\)", outputs=[]
    ),
    # --- execute: dataset files and records
    "execute-missing-file": Case(lambda w, t: execute(w, t, t / "none.jsonl"), r"none\.jsonl: file not found"),
    "execute-directory": Case(lambda w, t: execute(w, t, w.datasets), r"datasets: is a directory"),
    "execute-not-utf8": Case(
        lambda w, t: execute(w, t, with_bad_byte(w.dataset(0), t / "d.jsonl", 2)), r"d\.jsonl:2: not UTF-8"
    ),
    "execute-junk-line": Case(
        lambda w, t: execute(w, t, replaced(w.dataset(0), t / "d.jsonl", 2, '{"id": broken')),
        r"d\.jsonl:2: not valid JSON",
    ),
    "execute-array-line": Case(
        lambda w, t: execute(w, t, replaced(w.dataset(0), t / "d.jsonl", 2, "[1, 2]")),
        r"d\.jsonl:2: expected a JSON object",
    ),
    "execute-nan-input": Case(
        lambda w, t: execute(
            w, t, replaced(w.dataset(0), t / "d.jsonl", 1, read_lines(w.dataset(0))[0].replace('"x":', '"x":NaN,"_x":'))
        ),
        r"d\.jsonl:1: NaN is not strict JSON",
    ),
    "execute-infinity-input": Case(
        lambda w, t: execute(
            w,
            t,
            replaced(
                w.dataset(0), t / "d.jsonl", 1, read_lines(w.dataset(0))[0].replace('"y":', '"y":-Infinity,"_y":')
            ),
        ),
        r"d\.jsonl:1: -Infinity is not strict JSON",
    ),
    "execute-duplicate-id": Case(
        lambda w, t: execute(w, t, write_lines(t / "d.jsonl", read_lines(w.dataset(0)) * 2)),
        r"d\.jsonl:3: duplicate id .* \(first on line 1\)",
    ),
    "execute-missing-field": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 2, procedure=None)),
        r"d\.jsonl:2: Example record is missing field 'procedure'",
    ),
    "execute-wrong-type": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 1, length="5")), r"d\.jsonl:1: field 'length'"
    ),
    "execute-negative-length": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 1, length=-5)), r"d\.jsonl:1: .*'length' is -5"
    ),
    "execute-id-disagrees": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 1, index=7)), r"d\.jsonl:1: .*field 'id'"
    ),
    "execute-float-in-int-dataset": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 1, x=2.5)), r"d\.jsonl:1: .*field 'x'"
    ),
    "execute-operator-disagrees": Case(
        lambda w, t: execute(w, t, edited(w.dataset(0), t / "d.jsonl", 2, operator="mul")),
        r"d\.jsonl:2: .*field 'operator'",
    ),
    "execute-procedure-grammar": Case(
        lambda w, t: execute(w, t, bad_procedure_line(w, t)), r"d\.jsonl:2: .*procedure line"
    ),
    "execute-lone-surrogate": Case(
        lambda w, t: execute(w, t, surrogate_procedure(w, t)), r"d\.jsonl:1: .*procedure line"
    ),
    "execute-truncated-gz": Case(
        lambda w, t: execute(w, t, truncated_gz(w.dataset(0), t / "d.jsonl.gz")), r"d\.jsonl\.gz: truncated gzip file"
    ),
    "execute-plain-text-named-gz": Case(
        lambda w, t: execute(w, t, plain_named_gz(w.dataset(0), t / "d.jsonl.gz")), r"d\.jsonl\.gz: not a gzip file"
    ),
    # --- card and table4
    "card-directory-missing": Case(
        lambda w, t: [
            "card",
            "--datasets-dir",
            t / "none",
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "2",
            "--out",
            t / "out",
        ],
        r"none: datasets directory not found",
    ),
    "card-junk-dataset": Case(
        lambda w, t: [
            "card",
            "--datasets-dir",
            replaced(w.dataset(0), t / "ds" / w.dataset(0).name, 2, "junk").parent,
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "2",
            "--out",
            t / "out",
        ],
        r"add_int_1-10_k1\.jsonl:2: not valid JSON",
    ),
    "card-listed-dataset-missing": Case(
        lambda w, t: [
            "card",
            "--datasets-dir",
            w.datasets,
            "--datasets",
            "mul_int_1-10_k1",
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "2",
            "--out",
            t / "out",
        ],
        r"mul_int_1-10_k1\.jsonl",
    ),
    "table4-directory-missing": Case(
        lambda w, t: ["table4", "--references-dir", t / "none", "--out", t / "out"],
        r"none: references directory not found",
    ),
    "table4-no-reference-files": Case(
        lambda w, t: ["table4", "--references-dir", (t / "empty").mkdir() or t / "empty", "--out", t / "out"],
        r"empty: no reference files",
    ),
    "table4-final-banana": Case(
        lambda w, t: ["table4", "--references-dir", refs_dir_with(w, t, 1, final="banana"), "--out", t / "out"],
        r"refs/add_int_1-10_k1\.jsonl:1: .*field 'final' 'banana'",
    ),
    "table4-bad-trace-value": Case(
        lambda w, t: ["table4", "--references-dir", refs_dir_with(w, t, 2, trace=["1", "2", "x"]), "--out", t / "out"],
        r"refs/add_int_1-10_k1\.jsonl:2: .*field 'trace'",
    ),
    "table4-unknown-semantics": Case(
        lambda w, t: ["table4", "--references-dir", refs_dir_with(w, t, 1, semantics="eval"), "--out", t / "out"],
        r"refs/add_int_1-10_k1\.jsonl:1: .*field 'semantics'",
    ),
    # --- score: generation records, references, outputs
    "score-without-dataset": Case(
        lambda w, t: score(w, t)[:5] + score(w, t)[7:], r"required: --dataset", seed=SEED_SCORE
    ),
    "score-attempt-negative": Case(
        lambda w, t: score(w, t, gens_with(w, t, 1, attempt=-3)),
        r"g\.jsonl\.gz:1: .*field 'attempt' is -3",
        seed=SEED_SCORE,
    ),
    "score-tokens-negative": Case(
        lambda w, t: score(w, t, gens_with(w, t, 2, num_generated_tokens=-5)),
        r"g\.jsonl\.gz:2: .*field 'num_generated_tokens' is -5",
        seed=SEED_SCORE,
    ),
    "score-finish-reason-bogus": Case(
        lambda w, t: score(w, t, gens_with(w, t, 1, finish_reason="bogus")),
        r"g\.jsonl\.gz:1: .*field 'finish_reason' is 'bogus'",
        seed=SEED_SCORE,
    ),
    "score-offsets-unsorted": Case(
        lambda w, t: score(w, t, gens_with(w, t, 1, token_offsets=reversed_offsets(w))),
        r"g\.jsonl\.gz:1: .*token_offsets",
        seed=SEED_SCORE,
    ),
    "score-model-key": Case(
        lambda w, t: score(w, t, gens_with(w, t, 1, model="My Model")),
        r"g\.jsonl\.gz:1: .*field 'model'",
        seed=SEED_SCORE,
    ),
    "score-truncated-gz": Case(
        lambda w, t: score(w, t, truncated_gz(w.gens(0), t / "g.jsonl.gz")),
        r"g\.jsonl\.gz: truncated gzip",
        seed=SEED_SCORE,
    ),
    "score-plain-text-named-gz": Case(
        lambda w, t: score(w, t, plain_named_gz(w.gens(0), t / "g.jsonl.gz")),
        r"g\.jsonl\.gz: not a gzip file",
        seed=SEED_SCORE,
    ),
    "score-not-utf8": Case(
        lambda w, t: score(w, t, with_bad_byte(w.gens(0), t / "g.jsonl.gz", 2)),
        r"g\.jsonl\.gz:2: not UTF-8",
        seed=SEED_SCORE,
    ),
    "score-id-not-in-references": Case(
        lambda w, t: score(w, t, gens_with(w, t, 1, index=9, id=f"{DATASETS[0]}:5:9")),
        r"g\.jsonl\.gz:1: id .* is not in the references",
        seed=SEED_SCORE,
    ),
    "score-reference-banana": Case(
        lambda w, t: score(w, t, refs=edited(w.refs(0), t / "r.jsonl", 2, final="banana")),
        r"r\.jsonl:2: .*'final' 'banana'",
        seed=SEED_SCORE,
    ),
    "score-references-directory": Case(
        lambda w, t: score(w, t, refs=w.references), r"references: is a directory", seed=SEED_SCORE
    ),
    "score-dataset-missing": Case(
        lambda w, t: score(w, t, dataset=t / "none.jsonl"), r"none\.jsonl: file not found", seed=SEED_SCORE
    ),
    "score-out-unwritable": Case(
        lambda w, t: score(w, t, out=UNWRITABLE / "s.parquet"), r"s\.parquet: cannot write", outputs=[]
    ),
    # --- aggregate
    "aggregate-seed-negative": Case(
        lambda w, t: aggregate(w, t, extra=["--seed", "-1"]), r"--seed: -1", seed=_seed_dir("aggregate")
    ),
    "aggregate-resamples-zero": Case(
        lambda w, t: aggregate(w, t, extra=["--resamples", "0"]), r"--resamples: 0", seed=_seed_dir("aggregate")
    ),
    "aggregate-junk-parquet": Case(
        lambda w, t: aggregate(w, t, junk_parquet(t / "j.parquet")),
        r"j\.parquet: not a readable parquet",
        seed=_seed_dir("aggregate"),
    ),
    "aggregate-csv-named-parquet": Case(
        lambda w, t: aggregate(w, t, junk_parquet(t / "c.parquet", "csv")),
        r"c\.parquet: not a readable parquet",
        seed=_seed_dir("aggregate"),
    ),
    "aggregate-foreign-columns": Case(
        lambda w, t: aggregate(w, t, junk_parquet(t / "f.parquet", "columns")),
        r"f\.parquet: columns differ",
        seed=_seed_dir("aggregate"),
    ),
    "aggregate-missing-file": Case(
        lambda w, t: aggregate(w, t, t / "none.parquet"), r"none\.parquet: file not found", seed=_seed_dir("aggregate")
    ),
    "aggregate-directory": Case(
        lambda w, t: aggregate(w, t, w.scores(0).parent), r"simulator: is a directory", seed=_seed_dir("aggregate")
    ),
    "aggregate-same-file-twice": Case(
        lambda w, t: aggregate(w, t, w.scores(0), w.scores(0)),
        r"appears in more than one score file",
        seed=_seed_dir("aggregate"),
    ),
    "aggregate-out-under-a-file": Case(
        lambda w, t: aggregate(w, t, out=write_bytes(t / "afile", b"x") / "agg"),
        r"afile/agg: cannot write",
        outputs=["afile"],
    ),
    # --- simulate
    "simulate-failure-rate-2": Case(lambda w, t: simulate(w, t, "--failure-rate", "2"), r"--failure-rate: 2 must be"),
    "simulate-failure-rate-nan": Case(
        lambda w, t: simulate(w, t, "--failure-rate", "nan"), r"--failure-rate: 'nan' is not a number"
    ),
    "simulate-target-chars-negative": Case(lambda w, t: simulate(w, t, "--target-chars", "-1"), r"--target-chars"),
    "simulate-seed-negative": Case(lambda w, t: simulate(w, t, "--seed", "-1"), r"--seed"),
    "simulate-references-of-another-dataset": Case(
        lambda w, t: simulate(w, t, refs=w.refs(1)), r"mixed_float_0-1_k2\.jsonl:1: id .* is not in the dataset"
    ),
    # --- figures
    "figures-dpi-zero": Case(lambda w, t: figures(w, t, extra=["--dpi", "0"]), r"--dpi: 0", seed=_seed_dir("figures")),
    "figures-workers-zero": Case(
        lambda w, t: [
            "figures",
            "--config",
            w.config,
            "--aggregate-dir",
            w.aggregate,
            "--workers",
            "0",
            "--out-dir",
            t / "out",
        ],
        r"--workers: 0",
        seed=_seed_dir("figures"),
    ),
    "figures-aggregate-missing": Case(
        lambda w, t: figures(w, t, t / "agg-typo"),
        r"agg-typo: aggregate directory not found",
        seed=_seed_dir("figures"),
    ),
    "figures-junk-metrics": Case(
        lambda w, t: figures(w, t, aggregate_with(w, t, "metrics.parquet", junk_parquet)),
        r"agg/metrics\.parquet: not a readable parquet",
        seed=_seed_dir("figures"),
    ),
    "figures-metrics-column-missing": Case(
        lambda w, t: figures(
            w,
            t,
            aggregate_with(
                w, t, "metrics.parquet", lambda p: without_column(w.aggregate / "metrics.parquet", p, "value")
            ),
        ),
        r"metrics\.parquet: missing column\(s\) value",
        seed=_seed_dir("figures"),
    ),
    "figures-scores-missing": Case(
        lambda w, t: figures(w, t, aggregate_with(w, t, "scores.parquet", lambda p: None)),
        r"agg/scores\.parquet: file not found",
        seed=_seed_dir("figures"),
    ),
    # --- tables
    "tables-aggregate-missing": Case(
        lambda w, t: tables(w, t, t / "agg-typo"), r"agg-typo: aggregate directory not found", seed=_seed_dir("tables")
    ),
    "tables-references-missing": Case(
        lambda w, t: tables(w, t, references=t / "refs-typo"),
        r"refs-typo: references directory not found",
        seed=_seed_dir("tables"),
    ),
    "tables-reference-banana": Case(
        lambda w, t: tables(w, t, references=refs_dir_with(w, t, 1, final="banana")),
        r"refs/add_int_1-10_k1\.jsonl:1: .*'final'",
        seed=_seed_dir("tables"),
    ),
    "tables-config-not-utf8": Case(
        lambda w, t: tables(w, t, config=config_with(t, b"suite:\n  seed: \xff\n")),
        r"cfg\.yaml: not UTF-8 text \(byte 0xff at line 2\)",
        seed=_seed_dir("tables"),
    ),
    # --- report: a missing or broken input never replaces a good report
    "report-aggregate-mistyped": Case(
        lambda w, t: report_argv(w, t / "out", aggregate_dir=t / "agg-typo"),
        r"agg-typo: directory not found \(--aggregate-dir\)",
        seed=SEED_REPORT,
    ),
    "report-figures-missing": Case(
        lambda w, t: report_argv(w, t / "out", figures_dir=t / "figs-typo"), r"\(--figures-dir\)", seed=SEED_REPORT
    ),
    "report-benchmarks-mistyped": Case(
        lambda w, t: report_argv(w, t / "out", benchmarks_dir=t / "bench-typo"),
        r"bench-typo/infer/simulator/1-of-1\.tsv: not found",
        seed=SEED_REPORT,
    ),
    "report-junk-manifest": Case(
        lambda w, t: report_argv(
            w,
            t / "out",
            figures_dir=(lambda d: (d / "manifest.json").write_text("{junk") and d)(copy_dir(w.figures, t / "figs")),
        ),
        r"figs/manifest\.json:1: not valid JSON",
        seed=SEED_REPORT,
    ),
    "report-manifest-file-missing": Case(
        manifest_missing_file, r"manifest\.json: figure .* lists .*which is not in", seed=SEED_REPORT
    ),
    "report-table-csv-junk": Case(
        lambda w, t: tables_with(w, t, "table1_models.csv", b"\xff\xfe\x00junk"),
        r"tabs/table1_models\.csv",
        seed=SEED_REPORT,
    ),
    "report-table-csv-missing": Case(
        lambda w, t: tables_with(w, t, "table3_accuracy.csv", None),
        r"table3_accuracy\.csv: table not found",
        seed=SEED_REPORT,
    ),
    "report-benchmark-junk": Case(
        benchmarks_with_junk, r"1-of-1\.tsv: not a Snakemake benchmark file", seed=SEED_REPORT
    ),
    "report-generations-empty": Case(
        lambda w, t: report_argv(w, t / "out", generations_dir=(t / "gens").mkdir() or t / "gens"),
        r"gens/simulator/.*\.jsonl\.gz: file not found",
        seed=SEED_REPORT,
    ),
    "report-templates-missing": Case(
        lambda w, t: report_argv(w, t / "out") + ["--templates-dir", t / "tpl"],
        r"tpl: templates directory not found",
        seed=SEED_REPORT,
    ),
    # --- collect: all datasets checked before any file changes
    "collect-shard-missing": Case(
        lambda w, t: collect(w, t, w.shard(0), t / "none.jsonl.gz"),
        r"none\.jsonl\.gz: file not found",
        seed=_seed_dir("gens"),
    ),
    "collect-shard-truncated": Case(
        lambda w, t: collect(w, t, w.shard(0), truncated_gz(w.shard(1), t / "s.jsonl.gz")),
        r"s\.jsonl\.gz: truncated gzip",
        seed=_seed_dir("gens"),
    ),
    "collect-attempt-3": Case(
        lambda w, t: collect(w, t, w.shard(0), edited(w.shard(1), t / "s.jsonl.gz", 1, attempt=3)),
        r"has attempt 3; only 1 and 2",
        seed=_seed_dir("gens"),
    ),
    "collect-other-model": Case(
        lambda w, t: collect(w, t, w.shard(0), edited(w.shard(1), t / "s.jsonl.gz", 2, model="other")),
        r"s\.jsonl\.gz:2: record of model 'other', expected 'simulator'",
        seed=_seed_dir("gens"),
    ),
    "collect-second-dataset-incomplete": Case(
        shards_without_last_example_of_second,
        r"mixed_float_0-1_k2\.jsonl:2: no generation for mixed_float_0-1_k2:5:1",
        seed=_seed_dir("gens"),
    ),
    "collect-same-shard-twice": Case(
        lambda w, t: collect(w, t, w.shard(0), w.shard(0), w.shard(1)),
        r"appears in more than one shard",
        seed=_seed_dir("gens"),
    ),
    "collect-datasets-dir-missing": Case(
        lambda w, t: collect(w, t, datasets_dir=t / "none"),
        r"none/add_int_1-10_k1\.jsonl: file not found",
        seed=_seed_dir("gens"),
    ),
    # --- the workflow's intermediate files the report and status read (issue 22)
    "report-benchmark-nan": Case(
        lambda w, t: report_argv(w, t / "out", benchmarks_dir=benchmarks_with(w, t, "s\th:m:s\nNaN\t0:00:12\n")),
        r"bench/infer/simulator/1-of-1\.tsv:2: column 's' is 'NaN', not a number of seconds",
        seed=SEED_REPORT,
    ),
    "report-benchmark-inf": Case(
        lambda w, t: report_argv(w, t / "out", benchmarks_dir=benchmarks_with(w, t, "s\n12\ninf\n")),
        r"1-of-1\.tsv:3: column 's' is 'inf'",
        seed=SEED_REPORT,
    ),
    "report-benchmark-negative": Case(
        lambda w, t: report_argv(w, t / "out", benchmarks_dir=benchmarks_with(w, t, "s\n-5\n")),
        r"1-of-1\.tsv:2: column 's' is '-5'",
        seed=SEED_REPORT,
    ),
    "report-benchmark-empty-value": Case(
        lambda w, t: report_argv(w, t / "out", benchmarks_dir=benchmarks_with(w, t, "s\tmax_rss\n\t5\n")),
        r"1-of-1\.tsv:2: column 's' is ''",
        seed=SEED_REPORT,
    ),
    "report-reproduction-verdict": Case(
        lambda w, t: reproduction_with(w, t, lambda x: _first_row_verdict(x, "maybe")),
        r"tabs/reproduction\.csv:2: column 'verdict': Input should be 'agrees', 'differs' or 'not run'",
        seed=SEED_REPORT,
    ),
    "report-reproduction-no-verdict": Case(
        lambda w, t: reproduction_with(w, t, lambda x: _without_column(x, "verdict")),
        r"tabs/reproduction\.csv: missing column\(s\) verdict",
        seed=SEED_REPORT,
    ),
    "report-reproduction-truncated": Case(
        lambda w, t: reproduction_with(w, t, lambda x: x[: x.index("\n") + 8]),
        r"tabs/reproduction\.csv:2: column '(source|measures|verdict)'",
        seed=SEED_REPORT,
    ),
    "report-reproduction-foreign": Case(
        lambda w, t: reproduction_with(w, t, lambda x: "a,b\n1,2\n"),
        r"tabs/reproduction\.csv: missing column\(s\) id, source, measures, verdict",
        seed=SEED_REPORT,
    ),
    "report-prompt-lacking-fields": Case(
        lambda w, t: prompts_with(w, t, {"model": MODEL, "example": "e"}),
        r"prompts/simulator\.json: not a rendered prompt .*: commit: Field required",
    ),
    "report-prompt-lacking-its-route": Case(
        lambda w, t: prompts_with(w, t, {**SHOWN, "decoded": None}),
        r"prompts/simulator\.json: .*route 'token ids' needs decoded",
    ),
    "status-results-missing": Case(
        lambda w, t: ["status", "--config", w.config, "--results", t / "results-typo"],
        r"--results \S*results-typo: no such folder",
        outputs=[],
    ),
    "status-json-benchmark-nan": Case(
        lambda w, t: ["status", "--config", w.config, "--json", "--results", status_results(w, t, "s\nnan\n")],
        r"results/benchmarks/infer/simulator/1-of-1\.tsv:2: column 's' is 'nan'",
        outputs=[],
    ),
    # --- check-config
    "check-config-overlay-syntax": Case(
        lambda w, t: ["check-config", w.config, config_with(t, "run_models: [a\n")],
        r"cfg\.yaml:2:\d+: not valid YAML",
        outputs=[],
    ),
    # --- issue 38: what the release commands write, harness logs, the pilot's figures, values vLLM refuses
    "export-generations-out-is-the-results": Case(
        lambda w, t: ["export", "generations", "--config", w.config, "--results", w.root, "--out", w.root],
        r"--out .*: holds the results' generations .*which replacing it would delete",
        outputs=[],
    ),
    "export-suite-out-holds-the-config": Case(
        lambda w, t: ["export", "suite", "--config", w.config, "--out", w.root],
        r"--out .*: holds a --config file",
        outputs=[],
    ),
    "import-harness-resps-a-string": Case(
        lambda w, t: (
            ["import-harness", "--lm-eval", lm_eval_sample_file(w, t, resps="A"), "--config", w.config]
            + ["--model", MODEL, "--out", t / "out"]
        ),
        r"samples_procexec\.jsonl:1: resps: Input should be a valid list",
        outputs=[],
    ),
    "import-harness-input-as-a-word": Case(
        lambda w, t: (
            ["import-harness", "--lm-eval", lm_eval_sample_file(w, t, {"x": "twelve"}), "--config", w.config]
            + ["--model", MODEL, "--out", t / "out"]
        ),
        r"samples_procexec\.jsonl:1: doc\.x: not an exact value",
        outputs=[],
    ),
    "report-speculative-text-for-a-number": Case(
        lambda w, t: (
            report_argv(w, t / "out") + ["--speculative", speculative_figures_file(t, mean_acceptance_length="fast")]
        ),
        r"figures\.json: not the figures of procexec speculative-pilot \(mean_acceptance_length: ",
        seed=SEED_REPORT,
    ),
    "report-speculative-more-identical-than-compared": Case(
        lambda w, t: (
            report_argv(w, t / "out") + ["--speculative", speculative_figures_file(t, identical=9, generations=4)]
        ),
        r"\(identical: 9 of 4 generations compared\)",
        seed=SEED_REPORT,
    ),
    "speculative-pilot-store-missing": Case(
        lambda w, t: (
            ["speculative-pilot", "--model", MODEL, "--plain", w.shard(0), "--speculative", w.shard(0)]
            + ["--plain-store", t / "no-store", "--speculative-store", t / "no-store", "--out", t / "out"]
        ),
        r"--plain-store .*no-store: is not a folder",
    ),
    "check-config-stream-interval-zero": Case(
        lambda w, t: [
            "check-config",
            w.config,
            config_with(t, "models:\n  ds-685:\n    serve_args: [--stream-interval, '0']\n"),
        ],
        r"models\.ds-685\.serve_args: --stream-interval 0: must be at least 1",
        outputs=[],
    ),
    "check-config-pilot-lookup-min-above-max": Case(
        lambda w, t: [
            "check-config",
            w.config,
            config_with(
                t,
                "pilot_speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 6, prompt_lookup_max: 2}\n",
            ),
        ],
        r"pilot_speculative\.prompt_lookup_min: 6 exceeds prompt_lookup_max 2",
        outputs=[],
    ),
    "check-config-watchdog-of-a-nanosecond": Case(
        lambda w, t: ["check-config", w.config, config_with(t, "inference:\n  stall_timeout_s: 1.0e-9\n")],
        r"inference\.stall_timeout_s: Input should be greater than or equal to 60",
        outputs=[],
    ),
    "check-config-overlay-key": Case(
        lambda w, t: ["check-config", w.config, config_with(t, "inference:\n  top_p: 7\n")],
        r"inference\.top_p",
        outputs=[],
    ),
    # Snakemake itself prints a traceback for this overlay (docs/workflow.md): check-config is the way to read it
    "check-config-overlay-impossible-date": Case(
        lambda w, t: ["check-config", w.config, config_with(t, "inference:\n  template_date: 2026-13-45\n")],
        r"inference\.template_date: '2026-13-45' is not a calendar date \(month must be in 1\.\.12, line 2\)",
        outputs=[],
    ),
}


def _snapshot(paths: list[Path]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in paths:
        for item in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            files[str(item)] = item.read_bytes()
    return files


def _leftovers(folders: list[Path]) -> list[str]:
    found = []
    for folder in folders:
        if folder.is_dir():
            found += [
                str(p) for p in folder.rglob(".*") if p.name.endswith(".tmp") or p.name.startswith(".procexec-commit")
            ]
    return found


def _one_error_line(err: str, command: str, message: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    assert lines[0].startswith(f"procexec {command}: error: "), lines[0]
    assert re.search(message, lines[0]), (message, lines[0])
    return lines[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_fails_cleanly(name: str, world: World, tmp_path: Path) -> None:
    case = CASES[name]
    tmp = tmp_path / "case"
    tmp.mkdir()
    if case.seed is not None:
        case.seed(world, tmp)
    else:
        for output in case.outputs:
            if not (tmp / output).exists():
                (tmp / output).write_bytes(b"previous output\n")
    argv = case.build(world, tmp)
    outputs = [tmp / o for o in case.outputs]
    before = _snapshot(outputs)
    world_before = _snapshot([world.root])
    code, err = run(argv)
    assert code == 2, err
    _one_error_line(err, str(argv[0]), case.message.replace("{tmp}", re.escape(str(tmp))))
    assert _snapshot(outputs) == before, "the previous output changed"
    assert _snapshot([world.root]) == world_before, "an input changed"
    assert not _leftovers([tmp, world.root]), _leftovers([tmp, world.root])


def test_a_whole_rendered_prompt_file_reaches_the_page(world: World, tmp_path: Path) -> None:
    ok(prompts_with(world, tmp_path, SHOWN))
    page = (tmp_path / "out").read_text(encoding="utf-8")
    assert 'id="prompt-simulator"' in page and "12 tokens, sha256 <code>0000000000000000</code>" in page


def test_there_are_at_least_60_cases() -> None:
    """60 distinct cases as written: a name repeated in the CASES literal silently replaces the earlier case."""
    import ast

    tree = ast.parse(Path(__file__).read_text())
    literal = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CASES"
    )
    written = [key.value for key in literal.keys]
    repeated = sorted({name for name in written if written.count(name) > 1})
    assert repeated == [], f"cases written twice (the first is lost): {repeated}"
    assert len(CASES) == len(written) >= 60


# ----------------------------------------------------------------------------- not errors


def test_a_lone_surrogate_in_model_text_is_scored_and_kept_escaped(world: World, tmp_path: Path) -> None:
    """``"\\ud800"`` in a generation's text (a JSON escape) is no crash: scored, stored losslessly."""
    import pyarrow.parquet as pq

    from procexec.io.jsonl import read_jsonl

    record = json.loads(read_lines(world.gens(0))[0])
    record["text"] = record["text"] + "<answer>\ud800 7</answer>"  # the last answer span: unparseable
    lines = read_lines(world.gens(0))
    lines[0] = json.dumps(record)  # ensure_ascii: written as the escape \ud800
    gens = write_lines(tmp_path / "g.jsonl.gz", lines)
    out = tmp_path / "s.parquet"
    code, err = run(score(world, tmp_path, gens, out=out))
    assert code == 0, err
    assert pq.read_table(out).num_rows == len(lines)
    # and collect writes it back as the same JSON escape: a lossless round trip
    shards = [gens, world.shard(1)]
    code, err = run(
        [
            "collect",
            "--model",
            MODEL,
            "--shards",
            *shards,
            "--datasets-dir",
            world.datasets,
            "--datasets",
            *DATASETS,
            "--out-dir",
            tmp_path / "g",
        ]
    )
    assert code == 0, err
    again = {obj["id"]: obj for _, obj in read_jsonl(tmp_path / "g" / world.gens(0).name)}
    assert again[record["id"]]["text"] == record["text"]
    assert b"\\ud800" in gzip.decompress((tmp_path / "g" / world.gens(0).name).read_bytes())


def test_non_ascii_digits_are_not_numbers(world: World, tmp_path: Path) -> None:
    """``<answer>٦</answer>`` is unparseable (docs/scoring.md: ASCII digits only)."""
    import pyarrow.parquet as pq

    lines = read_lines(world.gens(0))
    records = [json.loads(line) for line in lines]
    for record in records:
        record["text"] = "<answer>\u0666</answer> <answer>\uff16</answer>"
        record["token_offsets"] = record["token_ids"] = None
    gens = write_lines(tmp_path / "g.jsonl.gz", [json.dumps(r) for r in records])
    out = tmp_path / "s.parquet"
    code, err = run(score(world, tmp_path, gens, out=out))
    assert code == 0, err
    rows = pq.read_table(out).to_pylist()
    assert all(r["n_answers"] == 2 and r["n_parseable"] == 0 and not r["faa"] for r in rows)


# ----------------------------------------------------------------------------- the real entry point


@pytest.mark.parametrize("case", ["generate-seed-negative", "score-truncated-gz", "report-aggregate-mistyped"])
def test_subprocess_exit_code_and_one_line(case: str, world: World, tmp_path: Path) -> None:
    tmp = tmp_path / "case"
    tmp.mkdir()
    spec = CASES[case]
    if spec.seed is not None:
        spec.seed(world, tmp)
    argv = [str(a) for a in spec.build(world, tmp)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "procexec.cli", *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    _one_error_line(proc.stderr, argv[0], spec.message)


# ----------------------------------------------------------------------------- the workflow's config

SNAKEMAKE = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or shutil.which("snakemake")
TINY = REPO / "config" / "test-tiny.yaml"


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Snakefile, rules and config beside each other in a scratch folder (config.yaml can then be broken)."""
    root = tmp_path_factory.mktemp("workflow-copy")
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(REPO / name, root / name)
    for name in ("rules", "envs", "workflow_scripts", "config"):
        shutil.copytree(REPO / name, root / name)
    return root


WORKFLOW_CASES = {
    # name: (config.yaml text change or None, overlay text or None, message regex)
    "config-yaml-syntax": (("suite:\n", "suite:\n  seed: [1\n"), None, r"config\.yaml:\d+:\d+: not valid YAML"),
    "config-yaml-duplicate-key": (
        ("suite:\n", "suite:\n  seed: 3\n"),
        None,
        r"config\.yaml:\d+:\d+: .*'seed' appears twice",
    ),
    "overlay-duplicate-key": (
        None,
        "run_models: [tiny-llama]\nrun_models: [tiny-llama]\n",
        r"bad\.yaml:2:1: .*'run_models' appears twice",
    ),
    "overlay-schema": (None, "suite:\n  seed: twelve\n", r"suite\.seed: 'twelve' is not of type 'integer'"),
    "overlay-tp-on-cpu-model": (
        None,
        "models:\n  tiny-llama:\n    tensor_parallel_size: 2\n",
        r"models\.tiny-llama\.tensor_parallel_size",
    ),
    "overlay-unknown-run-model": (None, "run_models: [nope]\n", r"run_models: unknown model key 'nope'"),
    "overlay-unknown-dataset": (
        None,
        "suite:\n  datasets: [add_int_1-10_k9]\n",
        r"suite\.datasets: unknown dataset id",
    ),
}


@pytest.mark.workflow
@pytest.mark.parametrize("name", sorted(WORKFLOW_CASES))
def test_workflow_config_error_is_one_line_exit_2(name: str, workflow_copy: Path, tmp_path: Path) -> None:
    change, overlay, message = WORKFLOW_CASES[name]
    snakefile_dir = tmp_path / "wf"
    shutil.copytree(workflow_copy, snakefile_dir)
    if change is not None:
        config = snakefile_dir / "config.yaml"
        config.write_text(config.read_text().replace(*change, 1))
    configfiles = [str(TINY)]
    if overlay is not None:
        (tmp_path / "bad.yaml").write_text(overlay)
        configfiles.append(str(tmp_path / "bad.yaml"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
    }
    cmd = [SNAKEMAKE, "-s", str(snakefile_dir / "Snakefile"), "--directory", str(workdir), "-n", "--nocolor"]
    proc = dry_run([*cmd, "--configfile", *configfiles], workdir, env)  # the worker's dry-run process
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "WorkflowError" not in out, out[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("procexec workflow: error: "), proc.stderr[-3000:]
    assert re.search(message, errors[0]), errors[0]
    assert not (workdir / "results").exists()


def test_status_json_is_strict_json_with_the_benchmarks_hours(world: World, tmp_path: Path) -> None:
    """``procexec status --json`` on a real results folder: parseable by a strict reader (no NaN), hours counted."""
    results = status_results(world, tmp_path, "s\th:m:s\n3600\t1:00:00\n1800\t0:30:00\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["status", "--config", str(world.config), "--results", str(results), "--json"])
    assert code == 0

    def refuse(name):
        raise ValueError(name)

    rows = json.loads(out.getvalue(), parse_constant=refuse)
    assert [r["model"] for r in rows] == [MODEL] and rows[0]["done"] == 0 and rows[0]["gpu_hours"] == 0.0  # gpus: 0
    assert rows[0]["rate_per_hour"] is None and rows[0]["total"] == 4

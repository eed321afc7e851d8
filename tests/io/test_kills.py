"""Multi-file outputs change all together: ``collect`` and ``aggregate`` killed between their writes.

Each command rewrites an output folder that holds the complete *old* set of
files with the *new* set.  A test-only hook (``PROCEXEC_PAUSE_AT``, see
``procexec.io.files.checkpoint``) stops the command at a named point -- after
the first file is written, at the commit point, between two renames -- and
the test sends SIGTERM (what SLURM and Snakemake send) or SIGKILL:

* SIGTERM in the write phase: exit 143, the old set, no temporary file.
* SIGTERM in the commit phase: the signal waits for the commit, exit 143, the new set.
* SIGKILL anywhere: every file is its old or new version; after ``settle`` (what
  the next writer and the aggregate's readers do) the set is the old one (write
  phase) or the new one (commit phase), complete; the next run leaves no temporary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procexec.cli import main
from procexec.io.files import settle

REPO = Path(__file__).resolve().parents[2]
DATASETS = ["add_int_1-10_k1", "mixed_float_0-1_k2"]
WRITE, COMMIT = "write", "commit"


def ok(argv: list) -> None:
    assert main([str(a) for a in argv]) == 0, argv


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Arguments of an old and a new run of both commands, with inputs on disk."""
    root = tmp_path_factory.mktemp("kills")
    data, refs = root / "datasets", root / "references"
    for dataset in DATASETS:
        ok(
            [
                "generate",
                "--dataset",
                dataset,
                "--seed",
                "3",
                "--lengths",
                "5",
                "--examples-per-length",
                "3",
                "--out",
                data / f"{dataset}.jsonl",
            ]
        )
        ok(["execute", "--in", data / f"{dataset}.jsonl", "--out", refs / f"{dataset}.jsonl"])
        for seed in (0, 1):
            ok(
                [
                    "simulate",
                    "--dataset",
                    data / f"{dataset}.jsonl",
                    "--references",
                    refs / f"{dataset}.jsonl",
                    "--seed",
                    seed,
                    "--target-chars",
                    "400",
                    "--out",
                    root / f"shards-{seed}" / f"{dataset}.jsonl.gz",
                ]
            )
        ok(
            [
                "score",
                "--generations",
                root / "shards-0" / f"{dataset}.jsonl.gz",
                "--references",
                refs / f"{dataset}.jsonl",
                "--dataset",
                data / f"{dataset}.jsonl",
                "--out",
                root / "scores" / f"{dataset}.parquet",
            ]
        )

    def collect(seed: int) -> list:
        shards = [root / f"shards-{seed}" / f"{d}.jsonl.gz" for d in DATASETS]
        return ["collect", "--model", "simulator", "--shards", *shards, "--datasets-dir", data, "--datasets", *DATASETS]

    scores = [root / "scores" / f"{d}.parquet" for d in DATASETS]
    return {
        "collect-old": collect(0),
        "collect-new": collect(1),
        "aggregate-old": ["aggregate", "--scores", scores[0], "--resamples", "30"],
        "aggregate-new": ["aggregate", "--scores", *scores, "--resamples", "30"],
    }


def _argv(inputs: dict, command: str, which: str, out: Path) -> list[str]:
    return [str(a) for a in inputs[f"{command}-{which}"]] + ["--out-dir", str(out)]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _visible(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if not name.startswith(".")}


@pytest.fixture(scope="module")
def expected(inputs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """The old and the new set of each command, from uninterrupted runs (both are deterministic)."""
    sets = {}
    for command in ("collect", "aggregate"):
        for which in ("old", "new"):
            out = tmp_path_factory.mktemp(f"{command}-{which}")
            ok(_argv(inputs, command, which, out))
            again = tmp_path_factory.mktemp(f"{command}-{which}-again")
            ok(_argv(inputs, command, which, again))
            assert _files(out) == _files(again), "outputs must be deterministic for this test"
            sets[f"{command}-{which}"] = _files(out)
        assert sets[f"{command}-old"] != sets[f"{command}-new"]
    assert (
        set(sets["aggregate-old"]) == set(sets["aggregate-new"]) == {"scores.parquet", "metrics.parquet", "metrics.csv"}
    )
    return sets


POINTS = [
    ("collect", f"fileset:written:{DATASETS[0]}.jsonl.gz", WRITE),
    ("collect", "fileset:journal", COMMIT),
    ("collect", f"fileset:renamed:{DATASETS[0]}.jsonl.gz", COMMIT),
    ("aggregate", "fileset:written:scores.parquet", WRITE),
    ("aggregate", "fileset:written:metrics.parquet", WRITE),
    ("aggregate", "fileset:journal", COMMIT),
    ("aggregate", "fileset:renamed:metrics.parquet", COMMIT),
]


def _run_until(argv: list[str], point: str, marker: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "PROCEXEC_PAUSE_AT": point,
        "PROCEXEC_PAUSE_FILE": str(marker),
        "PROCEXEC_PAUSE_SECONDS": "120",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "procexec.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"finished before reaching {point}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never reached {point}")
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize(
    "command, point, phase", POINTS, ids=[f"{c}-{p.split(':')[1]}-{p.split(':')[-1]}" for c, p, _ in POINTS]
)
def test_killed_between_writes_leaves_a_complete_set(command, point, phase, sig, inputs, expected, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    old, new = expected[f"{command}-old"], expected[f"{command}-new"]
    for name, data in old.items():
        (out / name).write_bytes(data)
    proc = _run_until(_argv(inputs, command, "new", out), point, tmp_path / "paused")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    files = _files(out)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, stderr
        assert stderr.strip().splitlines() == [f"procexec {command}: interrupted"], stderr
        assert files == (new if phase == COMMIT else old)  # nothing hidden left either: no temporary, no journal
    else:
        assert proc.returncode == -signal.SIGKILL
        assert all(files[name] in (old[name], new[name]) for name in _visible(files)), "a torn file"
        journals = [name for name in files if name.startswith(".procexec-commit.")]
        assert bool(journals) == (phase == COMMIT)
        if point.startswith("fileset:renamed:"):  # killed mid-commit: really half old, half new until settled
            renamed = point.split(":")[-1]
            assert files[renamed] == new[renamed] and any(files[n] == old[n] != new[n] for n in old)
        settle(out)
        assert _visible(_files(out)) == (new if phase == COMMIT else old)
    assert main(_argv(inputs, command, "new", out)) == 0  # the next run: the new set, nothing left over
    assert _files(out) == new


def test_a_reader_settles_an_interrupted_aggregate(inputs, expected, tmp_path):
    """`procexec tables` (a reader of the aggregate) finishes a commit a SIGKILL interrupted."""
    out = tmp_path / "agg"
    out.mkdir()
    for name, data in expected["aggregate-old"].items():
        (out / name).write_bytes(data)
    proc = _run_until(_argv(inputs, "aggregate", "new", out), "fileset:renamed:scores.parquet", tmp_path / "paused")
    proc.kill()
    proc.wait(timeout=60)
    assert any(p.name.startswith(".procexec-commit.") for p in out.iterdir())
    from procexec.analysis.artifacts import read_metrics

    read_metrics(out)
    assert _files(out) == expected["aggregate-new"]


def test_sigint_is_exit_130(inputs, tmp_path):
    proc = _run_until(
        _argv(inputs, "collect", "new", tmp_path / "out"),
        f"fileset:written:{DATASETS[0]}.jsonl.gz",
        tmp_path / "paused",
    )
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and stderr.strip() == "procexec collect: interrupted"
    assert not [p for p in (tmp_path / "out").iterdir()]


def test_sigterm_removes_the_temporary_of_a_single_file_output(inputs, tmp_path):
    """SIGTERM while `score` is running (before its atomic_write renames): no output, no temporary."""
    shards = Path(inputs["collect-old"][4]).parent
    root = shards.parent
    out = tmp_path / "s.parquet"
    argv = [
        "score",
        "--generations",
        str(shards / f"{DATASETS[0]}.jsonl.gz"),
        "--references",
        str(root / "references" / f"{DATASETS[0]}.jsonl"),
        "--dataset",
        str(root / "datasets" / f"{DATASETS[0]}.jsonl"),
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_SCORE, *argv], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".s.parquet.") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert not out.exists() and not list(tmp_path.glob(".s.parquet.*"))


# `procexec score` whose parquet writer sleeps inside atomic_write (the temporary exists).
_SLOW_SCORE = """
import sys, time
import pyarrow.parquet as pq
real = pq.write_table
def slow(table, handle, **kw):
    time.sleep(30)
    real(table, handle, **kw)
pq.write_table = slow
from procexec.cli import main
sys.exit(main(sys.argv[1:]))
"""

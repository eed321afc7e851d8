"""``procexec collect``: merge a model's shard files into one file per dataset.

The output is what scoring reads, so it is checked here: every example of the
dataset has exactly one attempt 1, at most one attempt 2 (and only after an
attempt 1), nothing belongs to another model or to no example.  Every dataset
is checked before anything is written, and the files are written as one
``FileSet``: a failure or a kill leaves the previous set of files complete.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from procexec.errors import ProcexecError
from procexec.io.files import FileSet
from procexec.io.jsonl import read_jsonl, write_lines
from procexec.records import Example, GenerationRecord, first_missing


def model_records(shard: Path, model: str) -> Iterator[tuple[str, GenerationRecord]]:
    """A shard file's records with their ``file:line``; a record of another model is refused."""
    for number, obj in read_jsonl(shard):
        where = f"{shard}:{number}"
        record = GenerationRecord.from_json(obj, where)
        if record.model != model:
            raise ProcexecError(f"{where}: record of model '{record.model}', expected '{model}'")
        yield where, record


def collect(model: str, shards: list[Path], datasets_dir: Path, datasets: list[str], out_dir: Path) -> dict[str, int]:
    """Write ``{out_dir}/{dataset}.jsonl.gz`` per dataset; returns records written per dataset.

    Records of datasets not listed are ignored, so one rule may collect one dataset.
    """
    if len(set(datasets)) != len(datasets):
        raise ProcexecError("--datasets: a dataset is listed twice")
    wanted = set(datasets)
    by_dataset: dict[str, dict[tuple[str, int], GenerationRecord]] = defaultdict(dict)
    for shard in shards:
        for where, record in model_records(shard, model):
            if record.attempt not in (1, 2):
                raise ProcexecError(f"{where}: {record.id} has attempt {record.attempt}; only 1 and 2 exist")
            if record.dataset not in wanted:
                continue
            slot = (record.id, record.attempt)
            if slot in by_dataset[record.dataset]:
                raise ProcexecError(f"{where}: {record.id} attempt {record.attempt} appears in more than one shard")
            by_dataset[record.dataset][slot] = record
    ordered: dict[str, list[GenerationRecord]] = {}
    for dataset in datasets:
        path = datasets_dir / f"{dataset}.jsonl"
        examples = [(n, Example.from_json(obj, f"{path}:{n}")) for n, obj in read_jsonl(path)]
        records = by_dataset.get(dataset, {})
        ids = {e.id for _, e in examples}
        first = {rid for rid, attempt in records if attempt == 1}
        if gap := first_missing(((f"{path}:{n}", e.id) for n, e in examples), first):
            raise ProcexecError(
                f"{gap.where}: no generation for {gap.id} in the given shards ({gap.count} example(s) of {dataset} lack one)"
            )
        for rid, _attempt in records:
            if rid not in ids:
                raise ProcexecError(f"{dataset}: generation for unknown example {rid}")
        ordered[dataset] = sorted(records.values(), key=lambda r: (r.length, r.index, r.attempt))
    written: dict[str, int] = {}
    with FileSet(out_dir) as files:
        for dataset, records_ in ordered.items():
            with files.open(f"{dataset}.jsonl.gz") as handle:
                written[dataset] = write_lines(handle, (r.to_json() for r in records_))
    return written

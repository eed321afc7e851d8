"""``procexec import-harness``: a harness's per-sample log as procexec generation records, one file per dataset.

The records go where ``procexec collect`` puts a model's (``<out>/<dataset>.jsonl.gz``), so ``score``,
``aggregate``, ``figures``, ``tables`` and ``report`` read a model evaluated elsewhere like one of the study's.
What a log lacks stays null: lm-eval keeps neither the finish reason nor a token count (``truncated`` and the
token metrics are then unknown, AP is measured in characters); inspect logs keep both.

The prompt is checked against procexec's own rendering where the log shows it: lm-eval's logged prompt
string, re-encoded as ``local-completions`` encoded it (``add_special_tokens=False``), must give the ids of
``procexec show-prompt`` for the model folder given; a mismatch names the harness setting that most likely
changed it.

With ``--datasets-dir``/``--datasets`` (the workflow's ``import_harness`` rule) exactly those datasets are
written, every example of their files must have a sample whose logged example is that line's (another seed
or suite is refused), and samples of other examples are left out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from procexec.config.model import ModelBase
from procexec.engine.tokenizer import ids_sha256
from procexec.errors import ProcexecError, reading
from procexec.harness.samples import HarnessOutput, generation_record
from procexec.io.files import FileSet
from procexec.io.jsonl import read_jsonl, write_lines
from procexec.records import Example, GenerationRecord, first_missing
from procexec.release.rows import SUITE_COLUMNS, example_of


def _lm_eval_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """lm-eval's samples file: JSON Lines with NaN for a metric without a value (procexec's reader refuses
    those; the metrics are recomputed here anyway)."""
    with reading(path), open(path, encoding="utf-8") as handle:
        for line, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise ProcexecError(f"{path}:{line}: not a JSON line of lm-eval's --log_samples ({exc})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("doc"), dict) or "resps" not in obj:
                raise ProcexecError(
                    f"{path}:{line}: not an lm-eval sample (no 'doc' and 'resps'); pass the "
                    "samples_<task>_<date>.jsonl files of --log_samples"
                )
            yield line, obj


def _row(doc: dict[str, Any], where: str) -> dict[str, Any]:
    missing = [c for c in SUITE_COLUMNS if c not in doc]
    if missing:
        raise ProcexecError(f"{where}: the sample's row lacks {', '.join(missing[:3])}: not a procexec task's sample")
    example_of(doc, where)  # the row's fields are checked as a dataset line's
    return doc


def _prompt_trap(prompt: str, row: dict[str, Any]) -> str:
    """The lm-eval setting that most likely made the logged prompt differ from procexec's."""
    if row["system"] + row["user"] in prompt:
        return "system and user text glued together: run lm-eval with --apply_chat_template"
    if f"\n\n{row['system']}" in prompt:
        return "text before procexec's system prompt: drop --system_instruction"
    return "another chat template, tokenizer or template setting than the model's"


#: One imported sample: its record, the example its log holds, and where in which log it is.
Imported = tuple[GenerationRecord, Example, str]


def lm_eval_records(
    paths: list[Path], model: str, model_dir: str | None, entry: ModelBase, template_date: dt.date
) -> Iterator[Imported]:
    """The records of lm-eval samples; with ``model_dir`` each logged prompt is checked (``entry``: the model's
    config entry, its template settings)."""
    from procexec.harness import tokens

    for path in paths:
        for line, sample in _lm_eval_lines(path):
            where = f"{path}:{line}"
            row = _row(sample["doc"], where)
            text = sample["resps"][0][0] if sample["resps"] and sample["resps"][0] else None
            if not isinstance(text, str):
                raise ProcexecError(f"{where}: 'resps' holds no generated text")
            prompt_text = sample.get("arguments", {}).get("gen_args_0", {}).get("arg_0")
            sha, count = "", 0
            if model_dir is not None:
                if not isinstance(prompt_text, str):
                    raise ProcexecError(f"{where}: no logged prompt (arguments.gen_args_0.arg_0) to check")
                ours = tokens.render(
                    model_dir, example_of(row), entry.system_role, entry.chat_template_kwargs, template_date
                )
                sent = tokens.hf_tokenizer(model_dir).encode(prompt_text, add_special_tokens=False)
                if sent != ours.token_ids:
                    raise ProcexecError(
                        f"{where}: the prompt lm-eval sent is not procexec's ({_prompt_trap(prompt_text, row)})"
                    )
                sha, count = ids_sha256(sent), len(sent)
            provenance = {"harness": "lm-eval", "log": str(path), "log_line": line}
            output = HarnessOutput(text=text, prompt_sha256=sha, prompt_tokens=count, provenance=provenance)
            yield generation_record(row, output, model, where), example_of(row, where), where


def inspect_records(paths: list[Path], model: str) -> Iterator[Imported]:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise ProcexecError("--inspect needs inspect_ai: pip install 'procexec[harness]'") from None
    from procexec.harness.inspect_task import UnscorableOutput, harness_output

    for path in paths:
        if not path.is_file():
            raise ProcexecError(f"{path}: file not found")
        try:
            log = read_eval_log(str(path))
        except Exception as exc:  # noqa: BLE001 -- inspect's reader raises anything on a foreign file
            raise ProcexecError(
                f"{path}: not an inspect log ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
            ) from None
        if log.eval.task_registry_name != "procexec/procedural":
            raise ProcexecError(f"{path}: a log of {log.eval.task_registry_name}, not of procexec/procedural")
        model_dir = log.eval.task_args["model_dir"]
        for sample in log.samples or []:
            where = f"{path}: sample {sample.id}"
            row = _row(sample.metadata, where)
            try:
                output = harness_output(sample.output, row, model_dir)
            except UnscorableOutput as exc:
                raise ProcexecError(f"{where}: {exc}") from None
            provenance = {
                "harness": "inspect_ai",
                "log": str(path),
                "model": log.eval.model,
                "route": log.eval.task_args.get("route", "completions"),
            }
            record = generation_record(row, dataclasses.replace(output, provenance=provenance), model, where)
            yield record, example_of(row, where), where


def study_examples(datasets_dir: Path, datasets: list[str]) -> dict[str, list[tuple[str, Example]]]:
    """The examples the records must cover, per dataset: (file:line, example) in the files' order."""
    if len(set(datasets)) != len(datasets):
        raise ProcexecError("--datasets: a dataset is listed twice")
    out = {}
    for dataset in datasets:
        path = datasets_dir / f"{dataset}.jsonl"
        out[dataset] = [(f"{path}:{n}", Example.from_json(obj, f"{path}:{n}")) for n, obj in read_jsonl(path)]
    return out


def _covering(
    by_dataset: dict[str, dict[str, Imported]], study: dict[str, list[tuple[str, Example]]]
) -> dict[str, list[GenerationRecord]]:
    """The study's records, one per example of its datasets: the logs must hold each one, as that example."""
    chosen = {}
    for dataset, examples in study.items():
        logged = by_dataset.get(dataset, {})
        if gap := first_missing(((where, e.id) for where, e in examples), logged):
            raise ProcexecError(
                f"{gap.where}: no sample for {gap.id} in the logs given ({gap.count} example(s) of {dataset} lack one): "
                "the harness ran other datasets, lengths or examples than the study"
            )
        for where, example in examples:
            _, ran, log_where = logged[example.id]
            if ran != example:
                raise ProcexecError(
                    f"{log_where}: the logged example {example.id} is not {where} (another seed or suite version)"
                )
        chosen[dataset] = [logged[e.id][0] for _, e in examples]
    return chosen


def write_records(
    samples: Iterator[Imported], out_dir: Path, study: dict[str, list[tuple[str, Example]]] | None = None
) -> dict[str, int]:
    """One ``<dataset>.jsonl.gz`` per dataset (all or none replaced), examples in (length, index) order; with
    ``study`` (``study_examples``) exactly its datasets and examples."""
    by_dataset: dict[str, dict[str, Imported]] = {}
    for sample in samples:
        record = sample[0]
        seen = by_dataset.setdefault(record.dataset, {})
        if record.id in seen:
            raise ProcexecError(f"example {record.id} appears twice in the logs given")
        seen[record.id] = sample
    if not by_dataset:
        raise ProcexecError("the logs hold no samples")
    if study is None:
        chosen = {d: [s[0] for s in logged.values()] for d, logged in by_dataset.items()}
    else:
        chosen = _covering(by_dataset, study)
    with FileSet(out_dir) as files:
        for dataset, records in sorted(chosen.items()):
            with files.open(f"{dataset}.jsonl.gz") as handle:
                ordered = sorted(records, key=lambda r: (r.length, r.index))
                write_lines(handle, (r.to_json() for r in ordered))
    return {dataset: len(records) for dataset, records in chosen.items()}

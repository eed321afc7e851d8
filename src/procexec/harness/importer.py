"""``procexec import-harness``: a harness's per-sample log as procexec generation records, one file per dataset.

The records go where ``procexec collect`` puts a model's (``<out>/<dataset>.jsonl.gz``), so ``score``,
``aggregate``, ``figures``, ``tables`` and ``report`` read a model evaluated elsewhere like one of the study's.
What a log lacks stays null: lm-eval keeps neither the finish reason nor a token count (``truncated`` and the
token metrics are then unknown, AP is measured in characters); inspect logs keep both.

The logs are read as typed formats (``procexec.harness.logs``).  The prompt is checked against procexec's own
rendering where the log shows it: lm-eval's logged prompt string, re-encoded as ``local-completions`` encoded it
(``add_special_tokens=False``), must give the ids of ``procexec show-prompt`` for the model folder given (a
mismatch names the harness setting that most likely changed it), and it must have fitted the room the run left
a prompt (``max_length`` from lm-eval's results file beside the samples, ``max_gen_toks`` from the request):
lm-eval logs the whole prompt even where it sent only its last tokens.

With ``--datasets-dir``/``--datasets`` (the workflow's ``import_harness`` rule) exactly those datasets are
written, every example of their files must have a sample whose logged example is that line's (another seed
or suite is refused), and samples of other examples are left out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from procexec.config.model import ModelBase
from procexec.engine.tokenizer import ids_sha256
from procexec.errors import ProcexecError
from procexec.harness.logs import inspect_metadata, inspect_task_args, lm_eval_samples, run_model_args
from procexec.harness.samples import HarnessOutput, generation_record
from procexec.io.files import FileSet
from procexec.io.jsonl import read_jsonl, write_lines
from procexec.records import Example, GenerationRecord, first_missing


def _prompt_trap(prompt: str, row: dict[str, Any]) -> str:
    """The lm-eval setting that most likely made the logged prompt differ from procexec's."""
    if row["system"] + row["user"] in prompt:
        return "system and user text glued together: run lm-eval with --apply_chat_template"
    if f"\n\n{row['system']}" in prompt:
        return "text before procexec's system prompt: drop --system_instruction"
    return "another chat template, tokenizer or template setting than the model's"


#: One imported sample: its record, the example its log holds, and where in which log it is.
Imported = tuple[GenerationRecord, Example, str]


#: lm-eval 0.4.13's API models' max_gen_toks where a request's kwargs give none (lm_eval/models/api_models.py:124).
API_DEFAULT_MAX_GEN_TOKS = 256


def _room(
    path: Path, model_args: dict[str, Any] | None, gen_kwargs: dict[str, Any], where: str
) -> tuple[int, str] | None:
    """The prompt tokens the run that logged ``where`` sent at most (``lm_eval_task.prompt_room``); None: not
    known (a model lm-eval does not cut by these settings)."""
    from procexec.harness.lm_eval_task import HarnessSettingError, prompt_room

    if model_args is None:
        raise ProcexecError(
            f"{path}: no results_<date>.json of its run beside it: the run's max_length, which may have cut the "
            "prompt lm-eval logs whole, is unknown (keep lm-eval's --output_path folder as it wrote it)"
        )
    budget = gen_kwargs.get("max_gen_toks")
    if budget is None:  # the model's own budget: model_args text ("256") as lm-eval reads it
        budget = model_args.get("max_gen_toks", API_DEFAULT_MAX_GEN_TOKS)
        budget = int(budget) if str(budget).strip().isdigit() else budget
    if type(budget) is not int or budget < 1:
        raise ProcexecError(f"{where}: arguments.gen_args_0.arg_1.max_gen_toks: {budget!r:.40} is not a token budget")
    try:
        return prompt_room(model_args, budget)
    except HarnessSettingError as exc:
        raise ProcexecError(f"{path}: the run's {str(exc).removeprefix('procexec task: ')}") from None


def lm_eval_records(
    paths: list[Path], model: str, model_dir: str | None, entry: ModelBase, template_date: dt.date
) -> Iterator[Imported]:
    """The records of lm-eval samples; with ``model_dir`` each logged prompt is checked (``entry``: the model's
    config entry, its template settings): procexec's, and whole in what the run sent."""
    from procexec.harness import tokens

    for path in paths:
        model_args = run_model_args(path) if model_dir is not None else None
        for line, sample, example in lm_eval_samples(path):
            where, row = f"{path}:{line}", sample.doc
            sha, count = "", 0
            if model_dir is not None:
                request = sample.request()
                if request is None:
                    raise ProcexecError(f"{where}: no logged prompt (arguments.gen_args_0.arg_0) to check")
                prompt_text, gen_kwargs = request
                ours = tokens.render(model_dir, example, entry.system_role, entry.chat_template_kwargs, template_date)
                sent = tokens.hf_tokenizer(model_dir).encode(prompt_text, add_special_tokens=False)
                if sent != ours.token_ids:
                    raise ProcexecError(
                        f"{where}: the prompt lm-eval sent is not procexec's ({_prompt_trap(prompt_text, row)})"
                    )
                known = _room(path, model_args, gen_kwargs, where)
                if known is not None and len(sent) > known[0]:
                    room, settings = known
                    raise ProcexecError(
                        f"{where}: the prompt is {len(sent)} tokens, but the run's {settings} left {room}: lm-eval "
                        f"sent only its last {max(room, 0)}, and scored what came back (rerun with a larger one)"
                    )
                sha, count = ids_sha256(sent), len(sent)
            provenance = {"harness": "lm-eval", "log": str(path), "log_line": line}
            output = HarnessOutput(text=sample.text, prompt_sha256=sha, prompt_tokens=count, provenance=provenance)
            yield generation_record(row, output, model, where), example, where


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
        args = inspect_task_args(log.eval.task_args, str(path))
        if not log.samples:
            raise ProcexecError(f"{path}: no sample in the log (an inspect log written with --no-log-samples?)")
        for sample in log.samples:
            where = f"{path}: sample {sample.id}"
            example = inspect_metadata(sample.metadata, where)
            try:
                output = harness_output(sample.output, sample.metadata, args.model_dir)
            except UnscorableOutput as exc:
                raise ProcexecError(f"{where}: {exc}") from None
            provenance = {"harness": "inspect_ai", "log": str(path), "model": log.eval.model, "route": args.route}
            record = generation_record(
                sample.metadata, dataclasses.replace(output, provenance=provenance), model, where
            )
            yield record, example, where


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

"""The harness logs ``procexec import-harness`` reads, as typed formats: every field it uses has its JSON type
stated here, and a log that breaks one is refused in one line naming the file (and line or sample) and the field.

* lm-eval 0.4.13's ``--log_samples`` file (``samples_<task>_<date>.jsonl``, one sample a line;
  ``lm_eval/evaluator.py:640-667``, sanitised by ``lm_eval/loggers/evaluation_tracker.py:349-363``): ``doc`` is
  the task's row (``procexec.release.rows.read_row``), ``resps`` ``[[text]]`` (one request, one generation:
  procexec's tasks repeat none), ``arguments`` ``{"gen_args_0": {"arg_0": prompt, "arg_1": generation
  kwargs}}``, or the list ``[[prompt, kwargs]]`` lm-eval wrote before that sanitising.  Every other key
  (metrics, which lm-eval writes as NaN where a metric has no value, hashes, ``filtered_resps``) is left
  unread: procexec scores the text itself.
* lm-eval's results file beside the samples (``results_<date>.json``, ``evaluation_tracker.py:269-281``): the
  run's ``config.model_args`` (a ``k=v,...`` string or a mapping), which say how much of a prompt the model got.
* an inspect log of ``procexec/procedural``: the task's arguments (``model_dir``, ``route``) and each sample's
  ``metadata`` (the row, the prompt's sha256 and token ids), as ``procexec.harness.inspect_task`` wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from procexec.config import lm_eval_results_file
from procexec.errors import ProcexecError, first_problem, reading
from procexec.records import Example
from procexec.release.rows import read_row


class _Log(BaseModel):
    """A part of a harness's log: exact JSON types, keys procexec does not read allowed."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class GenArgs(_Log):
    """One request's arguments as lm-eval 0.4.13 logs them: the prompt text and the generation kwargs."""

    arg_0: StrictStr
    arg_1: dict[str, Any] = Field(default_factory=dict)


OneText = Annotated[list[StrictStr], Field(min_length=1, max_length=1)]


def _gen_args(arguments: Any) -> Any:
    """lm-eval's older list layout ``[[prompt, kwargs], ...]`` as 0.4.13 sanitises it (evaluation_tracker.py:353-357)."""
    if isinstance(arguments, list):
        return {
            f"gen_args_{i}": {f"arg_{j}": value for j, value in enumerate(arg)} if isinstance(arg, list) else arg
            for i, arg in enumerate(arguments)
        }
    return arguments


class LmEvalSample(_Log):
    """One line of lm-eval's samples file (the fields procexec reads)."""

    doc: dict[str, Any]
    resps: Annotated[list[OneText], Field(min_length=1, max_length=1)]
    arguments: Annotated[dict[str, GenArgs] | None, BeforeValidator(_gen_args)] = None

    @property
    def text(self) -> str:
        return self.resps[0][0]

    def request(self) -> tuple[str, dict[str, Any]] | None:
        """The logged prompt and generation kwargs of the request (None: not logged)."""
        first = (self.arguments or {}).get("gen_args_0")
        return None if first is None else (first.arg_0, first.arg_1)


def lm_eval_samples(path: Path) -> Iterator[tuple[int, LmEvalSample, Example]]:
    """(line, sample, its example) for each sample of an lm-eval samples file (one without any is refused)."""
    samples = 0
    with reading(path), open(path, encoding="utf-8") as handle:
        for line, text in enumerate(handle, 1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise ProcexecError(f"{where}: not a JSON line of lm-eval's --log_samples ({exc})") from None
            if not isinstance(obj, dict) or "doc" not in obj or "resps" not in obj:
                raise ProcexecError(
                    f"{where}: not an lm-eval sample (no 'doc' and 'resps'); pass the "
                    "samples_<task>_<date>.jsonl files of --log_samples"
                )
            try:
                sample = LmEvalSample.model_validate(obj)
            except ValidationError as exc:
                raise ProcexecError(f"{where}: {first_problem(exc, whole='the sample')}") from None
            samples += 1
            yield line, sample, read_row(sample.doc, where, "doc")
    if not samples:
        raise ProcexecError(f"{path}: no lm-eval sample in it (an empty samples file)")


class LmEvalConfig(_Log):
    model: StrictStr | None = None
    model_args: StrictStr | dict[str, Any] | None = None


class LmEvalResults(_Log):
    """The part of lm-eval's results file that says how a run sent its prompts."""

    config: LmEvalConfig


def run_model_args(samples: Path) -> dict[str, Any] | None:
    """The model arguments of the run that wrote ``samples``, from its results file beside it (the same date
    id; lm-eval's ``k=v,...`` string read as its ``simple_parse_args_string`` reads it, values kept as text);
    None when there is no such file."""
    results = lm_eval_results_file(samples)
    if results is None:
        return None
    with reading(results, (ValueError,)):
        obj = json.loads(results.read_text(encoding="utf-8"))
    try:
        config = LmEvalResults.model_validate(obj).config
    except ValidationError as exc:
        raise ProcexecError(f"{results}: {first_problem(exc, whole='the results file')}") from None
    args = config.model_args
    if args is None or isinstance(args, dict):
        return args or {}
    pairs = [item.split("=", 1) for item in args.split(",") if item]
    return {pair[0]: pair[1] if len(pair) == 2 else "" for pair in pairs}


class InspectTaskArgs(_Log):
    """``inspect eval procexec/procedural -T ...``: what the import needs of the task's arguments."""

    model_dir: StrictStr = Field(min_length=1)
    route: Literal["completions", "chat"] = "completions"


TokenId = Annotated[StrictInt, Field(ge=0, lt=1 << 32)]


class InspectMetadata(_Log):
    """A sample's metadata as the task wrote it: the suite row (checked by ``read_row``) and the prompt sent."""

    prompt_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1)]


def inspect_task_args(args: Any, where: str) -> InspectTaskArgs:
    """The task's arguments an import reads; ``model_dir`` must be a folder here (its tokenizer spells the text)."""
    try:
        typed = InspectTaskArgs.model_validate(args)
    except ValidationError as exc:
        raise ProcexecError(f"{where}: {first_problem(exc, prefix='eval.task_args', whole='eval.task_args')}") from None
    if not Path(typed.model_dir).is_dir():
        raise ProcexecError(
            f"{where}: eval.task_args.model_dir: {typed.model_dir!r:.200} is no folder here (the served model's "
            "folder: its tokenizer spells the logged output ids)"
        )
    return typed


def inspect_metadata(metadata: Any, where: str) -> Example:
    """The example of a sample's metadata, checked whole: each problem one line naming ``metadata.FIELD``."""
    try:
        InspectMetadata.model_validate(metadata)
    except ValidationError as exc:
        raise ProcexecError(f"{where}: {first_problem(exc, prefix='metadata', whole='metadata')}") from None
    return read_row(metadata, where, "metadata")

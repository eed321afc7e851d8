"""The functions procexec's lm-evaluation-harness 0.4.13 tasks call (``!function`` in lm_eval_tasks/*.yaml).

``rows`` is each task's ``custom_dataset``: it builds the dataset's rows in process with procexec's own
generator (the released dataset's rows, no download), or reads them from a dataset folder or hub id given as
``--metadata '{"dataset_path": ...}'``.  lm-eval hands it the model's arguments, so it refuses the settings
that silently change the prompt, among them a ``max_length`` that would cut one of the task's prompts (counted
with the model's tokenizer when ``tokenizer=`` or ``pretrained=`` names a local folder), before any request:
one line ``procexec task: error: ...`` on stderr and exit code 2 (an exception would reach the user as the
last line of lm-eval's traceback).  ``process_results`` scores the generated text with procexec's scorer
(``procexec.harness.samples``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procexec.harness.lm_eval_files import STUDY_BUDGET
from procexec.harness.samples import HarnessOutput, generation_record, metric_values, score_row

if TYPE_CHECKING:
    import datasets

#: lm-eval 0.4.13's API models' max_length when their model_args give none (lm_eval/models/api_models.py:127).
API_DEFAULT_MAX_LENGTH = 2048


class HarnessSettingError(ValueError):
    """A harness setting that would change the prompt or cut the generation without telling."""


def _is_false(value: Any) -> bool:
    return value is False or str(value).strip().lower() == "false"


def _whole_number(model_args: dict[str, Any], name: str, default: int | None = None) -> int | None:
    value = model_args.get(name, default)
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise HarnessSettingError(f"procexec task: {name}={value!r} in --model_args is not a whole number") from None


def prompt_room(model_args: dict[str, Any], max_gen_toks: int) -> tuple[int, str] | None:
    """The prompt tokens lm-eval 0.4.13 sends at most (it keeps the last ones of a longer prompt, and says so only
    in a log line), and the settings that leave them, in words: an API model (``base_url``) ``max_length - 1 -
    max_gen_toks`` (it keeps ``max_length - 1``, lm_eval/models/api_models.py:175-177, and slices the context,
    :760-771); the ``vllm`` model (``max_model_len``) ``max_model_len - max_gen_toks`` (models/utils.py:906-915);
    None: not known here (max_model_len=None is vLLM's own length; lm-eval's API model fails on max_length=None,
    :177, before the task is built)."""
    if "base_url" in model_args:
        length = _whole_number(model_args, "max_length", API_DEFAULT_MAX_LENGTH)
        if length is not None:
            return length - 1 - max_gen_toks, f"max_length {length} - 1 - max_gen_toks {max_gen_toks}"
    elif "pretrained" in model_args and "max_model_len" in model_args:
        length = _whole_number(model_args, "max_model_len")
        if length is not None:
            return length - max_gen_toks, f"max_model_len {length} - max_gen_toks {max_gen_toks}"
    return None


def _local_tokenizer(model_args: dict[str, Any]) -> str | None:
    """The model folder whose tokenizer lm-eval encodes prompts with, when the arguments name one here."""
    folder = model_args.get("tokenizer") or model_args.get("pretrained")
    return str(folder) if folder is not None and Path(str(folder)).is_dir() else None


def refuse_cut_prompts(task_rows: list[dict[str, Any]], model_args: dict[str, Any], max_gen_toks: int) -> None:
    """Each row's prompt, as lm-eval renders it with ``--apply_chat_template`` (the system and user turns, the
    generation prompt), within ``prompt_room``: counted with the model's tokenizer where one is here, a row
    whose rendered text has no more UTF-8 bytes than the room skipped uncounted (a token spells a byte or more)."""
    known = prompt_room(model_args, max_gen_toks)
    if known is None:
        return
    room, settings = known
    if room < 1:
        raise HarnessSettingError(
            f"procexec task: {settings} in --model_args leaves no prompt token (lm-eval would send none of the "
            f"prompt): set it to the longest prompt + max_gen_toks + 1"
        )
    folder = _local_tokenizer(model_args)
    if folder is None:
        return
    from procexec.harness.tokens import hf_tokenizer

    tokenizer = hf_tokenizer(folder)
    for row in task_rows:
        turns = [{"role": "system", "content": row["system"]}, {"role": "user", "content": row["user"]}]
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        if len(text.encode("utf-8")) <= room:
            continue
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        if tokens > room:
            raise HarnessSettingError(
                f"procexec task: the prompt of {row['id']} is {tokens} tokens, but {settings} in --model_args "
                f"leaves {room}: lm-eval would send only its last {room} (set it to at least {tokens} + "
                f"max_gen_toks + 1)"
            )


def refuse_traps(model_args: dict[str, Any]) -> None:
    """The traps of docs/harnesses.md that the task can see in lm-eval's model arguments."""
    if "base_url" in model_args:  # local-completions / local-chat-completions
        if "max_length" not in model_args:
            raise HarnessSettingError(
                "procexec task: set max_length in --model_args (longest prompt + max_gen_toks + 1): lm-eval's "
                "API models default to 2048 and cut the prompt to max_length - max_gen_toks tokens, "
                "with the study's 32768-token budget the whole prompt"
            )
        if "timeout" not in model_args:
            raise HarnessSettingError(
                "procexec task: set timeout in --model_args (e.g. timeout=86400): lm-eval's API models give a "
                "request 300 s in all, which a long generation overruns"
            )
    elif "pretrained" in model_args and not _is_false(model_args.get("add_bos_token")):
        raise HarnessSettingError(
            "procexec task: set add_bos_token=False in --model_args: the chat template already holds the BOS, "
            "and lm-eval's in-process models add a second one"
        )


def _test_split(
    dataset: str, dataset_path: str | None, seed: int | None, lengths: list[int] | None, per_length: int | None
) -> datasets.Dataset:
    import datasets

    from procexec.benchmark.suite import DatasetSpec, default_suite, generate_dataset
    from procexec.config.model import Suite
    from procexec.release.rows import rows_table, suite_row

    if dataset_path is not None:
        return datasets.load_dataset(dataset_path, dataset, split="test")
    suite = Suite.model_validate(default_suite())
    examples = generate_dataset(
        DatasetSpec.from_id(dataset),
        lengths or suite.lengths,
        per_length or suite.examples_per_length,
        suite.seed if seed is None else seed,
    )
    return datasets.Dataset(rows_table([suite_row(e) for e in examples]))


def _refused(exc: HarnessSettingError) -> SystemExit:
    """The task's refusal as the one line it is, exit code 2 (lm-eval lets a SystemExit end the run)."""
    print(f"procexec task: error: {str(exc).removeprefix('procexec task: ')}", file=sys.stderr, flush=True)
    return SystemExit(2)


def rows(
    dataset: str,
    dataset_path: str | None = None,
    seed: int | None = None,
    lengths: list[int] | None = None,
    examples_per_length: int | None = None,
    max_gen_toks: int = STUDY_BUDGET,
    **model_args: Any,
) -> dict[str, datasets.Dataset]:
    """The test split of one dataset: procexec's rows (the packaged suite, or the overrides given), or a
    released folder's.  ``max_gen_toks``: the budget the run asks (``--metadata`` beside a ``--gen_kwargs``
    that lowers it, which the task cannot see)."""
    try:
        refuse_traps(model_args)
        split = _test_split(dataset, dataset_path, seed, lengths, examples_per_length)
        refuse_cut_prompts(split.to_list(), model_args, int(max_gen_toks))
    except HarnessSettingError as exc:
        raise _refused(exc) from None
    return {"test": split}


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """procexec's metrics of one generation (lm-eval keeps no finish reason or token count: both unknown)."""
    return metric_values(score_row(doc, generation_record(doc, HarnessOutput(text=results[0]))))

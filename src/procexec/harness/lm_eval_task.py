"""The functions procexec's lm-evaluation-harness 0.4.13 tasks call (``!function`` in lm_eval_tasks/*.yaml).

``rows`` is each task's ``custom_dataset``: it builds the dataset's rows in process with procexec's own
generator (the released dataset's rows, no download), or reads them from a dataset folder or hub id given as
``--metadata '{"dataset_path": ...}'``.  lm-eval hands it the model's arguments, so it refuses, with one line,
the settings that silently change the prompt.  ``process_results`` scores the generated text with procexec's
scorer (``procexec.harness.samples``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from procexec.harness.samples import HarnessOutput, generation_record, metric_values, score_row

if TYPE_CHECKING:
    import datasets


class HarnessSettingError(ValueError):
    """A harness setting that would change the prompt or cut the generation without telling."""


def _is_false(value: Any) -> bool:
    return value is False or str(value).strip().lower() == "false"


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


def rows(
    dataset: str,
    dataset_path: str | None = None,
    seed: int | None = None,
    lengths: list[int] | None = None,
    examples_per_length: int | None = None,
    **model_args: Any,
) -> dict[str, datasets.Dataset]:
    """The test split of one dataset: procexec's rows (the packaged suite, or the overrides given), or a
    released folder's."""
    import datasets

    from procexec.benchmark.suite import DatasetSpec, default_suite, generate_dataset
    from procexec.config.model import Suite
    from procexec.release.rows import rows_table, suite_row

    refuse_traps(model_args)
    if dataset_path is not None:
        return {"test": datasets.load_dataset(dataset_path, dataset, split="test")}
    suite = Suite.model_validate(default_suite())
    examples = generate_dataset(
        DatasetSpec.from_id(dataset),
        lengths or suite.lengths,
        examples_per_length or suite.examples_per_length,
        suite.seed if seed is None else seed,
    )
    return {"test": datasets.Dataset(rows_table([suite_row(e) for e in examples]))}


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """procexec's metrics of one generation (lm-eval keeps no finish reason or token count: both unknown)."""
    return metric_values(score_row(doc, generation_record(doc, HarnessOutput(text=results[0]))))

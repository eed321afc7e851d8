"""The inspect_ai 0.3.285 task ``procexec/procedural`` (registered through the ``inspect_ai`` entry point).

Two routes to a vLLM server, both scored on the **raw** text, never on ``output.completion`` (the chat path
moves ``<think>...</think>`` out of it and strips whitespace, which changes FAA when an answer sits in the
think block):

* ``completions`` (``vllm-completions/`` or ``openai-api-completions/``): the prompt is procexec's rendering,
  sent as ``prompt_token_ids``, exactly the ids of ``procexec show-prompt``;
* ``chat`` (``vllm/``, ``openai-api/``): the server renders the turns.

On both, the server returns the output token ids as its logprob tokens (``return_tokens_as_token_ids``), and
the text and token offsets are spelled from them by procexec's detokenizer.  ``stop_reason`` and ``usage``
give the finish reason and the token count.  A context-length error inspect returns as an output fails the
sample: it is not a wrong answer.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageSystem, ChatMessageUser, GenerateConfig, ModelOutput
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, grouped, mean, metric, scorer
from inspect_ai.solver import TaskState, generate

from procexec.config.model import NEUTRAL_REQUEST_EXTRA, TEMPLATE_DATE
from procexec.harness.lm_eval_files import STUDY_BUDGET
from procexec.harness.samples import HARNESS_METRICS, HarnessOutput, generation_record, metric_values, score_row
from procexec.harness.tokens import hf_tokenizer, ids_of_logprob_tokens, render, spell

ROUTES = ("completions", "chat")
#: inspect's stop reasons -> procexec's finish reasons (anything else is no generation to score).
FINISH_REASONS = {"stop": "stop", "max_tokens": "length"}
#: Sent with every request: the neutral sampling values a vLLM server would otherwise take from the model's
#: generation_config.json, and the output ids as logprob tokens.
EXTRA_BODY = {**NEUTRAL_REQUEST_EXTRA, "return_tokens_as_token_ids": True}


class UnscorableOutput(RuntimeError):
    """A model output that is no generation (a context-length error, no token ids): the sample fails."""


def _suite_rows(
    datasets: str | list[str], lengths: list[int] | None, examples_per_length: int | None, seed: int | None
) -> list[dict[str, Any]]:
    from procexec.benchmark.suite import DatasetSpec, default_suite, expand_suite, generate_dataset
    from procexec.config.model import Suite
    from procexec.release.rows import suite_row

    suite = Suite.model_validate(default_suite())
    known = [spec.id for spec in expand_suite(suite)]
    names = known if datasets == "all" else [datasets] if isinstance(datasets, str) else list(datasets)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"procexec/procedural: dataset {unknown[0]!r} is not in the suite (e.g. add_int_1-10_k1)")
    return [
        suite_row(example)
        for name in names
        for example in generate_dataset(
            DatasetSpec.from_id(name),
            lengths or suite.lengths,
            examples_per_length or suite.examples_per_length,
            suite.seed if seed is None else seed,
        )
    ]


def _sample(row: dict[str, Any], route: str, model_dir: str, system_role: bool, date: dt.date) -> Sample:
    from procexec.release.rows import example_of

    example = example_of(row)
    ids = render(model_dir, example, system_role, template_date=date)  # sent on the completions route
    # the prompt as procexec's records key it: the ids, or on the chat route the turns the server renders
    prompt = (
        ids
        if route == "completions"
        else render(model_dir, example, system_role, template_date=date, server_renders=True)
    )
    metadata = {
        **row,
        "prompt_sha256": prompt.sha256,
        "prompt_token_ids": ids.token_ids,
        "system_folded": prompt.system_folded,
    }
    if route == "completions":
        messages = [ChatMessageUser(content=row["user"], metadata={"prompt_token_ids": ids.token_ids})]
    elif prompt.system_folded:
        messages = [ChatMessageUser(content=row["user_folded"])]
    else:
        messages = [ChatMessageSystem(content=row["system"]), ChatMessageUser(content=row["user"])]
    return Sample(id=row["id"], input=messages, target=row["final"], metadata=metadata)


def harness_output(output: ModelOutput, metadata: dict[str, Any], model_dir: str) -> HarnessOutput:
    """The raw generation of one inspect output: text and offsets spelled from the output ids."""
    if not output.choices:  # inspect's own stop_reason reads the first choice
        raise UnscorableOutput(f"sample {metadata['id']}: the output holds no choice, so no output token ids")
    if output.error or output.stop_reason not in FINISH_REASONS:
        raise UnscorableOutput(
            f"sample {metadata['id']}: no generation to score (stop reason "
            f"{output.stop_reason}{': ' + output.error if output.error else ''})"
        )
    choice = output.choices[0]
    ids = ids_of_logprob_tokens([lp.token for lp in choice.logprobs.content] if choice.logprobs else [])
    if ids is None:
        raise UnscorableOutput(
            f"sample {metadata['id']}: the server returned no output token ids (a vLLM server "
            "with logprobs and return_tokens_as_token_ids is needed for the raw text)"
        )
    vocabulary = len(hf_tokenizer(model_dir))
    if max(ids) >= vocabulary:
        raise UnscorableOutput(
            f"sample {metadata['id']}: output token id {max(ids)} is outside the vocabulary of {model_dir} "
            f"({vocabulary} ids): not that model's output"
        )
    text, offsets = spell(model_dir, metadata["prompt_token_ids"], ids)
    usage = output.usage  # the server's counts (on the chat route its own rendering's prompt)
    return HarnessOutput(
        text=text,
        finish_reason=FINISH_REASONS[output.stop_reason],
        num_generated_tokens=len(ids) if usage is None else usage.output_tokens,
        token_ids=ids,
        token_offsets=offsets,
        prompt_sha256=metadata["prompt_sha256"],
        prompt_tokens=len(metadata["prompt_token_ids"]) if usage is None else usage.input_tokens,
    )


@metric
def nanmean() -> Metric:
    """The mean over the samples that have a value (AP: the examples with a parseable answer)."""

    def compute(scores: list[SampleScore]) -> float:
        values = [float(s.score.value) for s in scores if not math.isnan(float(s.score.value))]
        return sum(values) / len(values) if values else math.nan

    return compute


def _metrics() -> dict[str, list[Metric]]:
    return {name: [grouped(nanmean() if name == "ap" else mean(), "dataset")] for name in HARNESS_METRICS}


@scorer(metrics=_metrics())
def procexec_scorer(model_dir: str) -> Scorer:
    """procexec's score row of the raw text; its HARNESS_METRICS values are the score, the row its metadata."""

    async def score(state: TaskState, target: Target) -> Score:
        row = state.metadata
        output = harness_output(state.output, row, model_dir)
        values = score_row(row, generation_record(row, output))
        return Score(
            value=metric_values(values),
            answer=values["first_answer_raw"],
            metadata={
                "score_row": json.loads(json.dumps(values, allow_nan=True)),
                "raw_text": output.text,
                "finish_reason": output.finish_reason,
                "num_generated_tokens": output.num_generated_tokens,
                "token_offsets": output.token_offsets,
            },
        )

    return score


@task
def procedural(
    model_dir: str,
    datasets: str | list[str] = "all",
    lengths: list[int] | None = None,
    examples_per_length: int | None = None,
    seed: int | None = None,
    route: str = "completions",
    system_role: bool = True,
    max_tokens: int = STUDY_BUDGET,
    template_date: str = str(TEMPLATE_DATE),
) -> Task:
    """procexec's suite (or the datasets, lengths and examples per length given), greedy, the study's budget.

    ``model_dir`` is the served model's folder (its tokenizer renders the prompt and spells the output ids).
    """
    if route not in ROUTES:
        raise ValueError(f"procexec/procedural: route {route!r} is not one of {', '.join(ROUTES)}")
    date = dt.date.fromisoformat(template_date)
    samples = [
        _sample(row, route, model_dir, system_role, date)
        for row in _suite_rows(datasets, lengths, examples_per_length, seed)
    ]
    return Task(
        dataset=MemoryDataset(samples, name="procexec"),
        solver=generate(),
        scorer=procexec_scorer(model_dir),
        config=GenerateConfig(
            temperature=0.0, top_p=1.0, seed=0, max_tokens=max_tokens, logprobs=True, extra_body=EXTRA_BODY
        ),
    )

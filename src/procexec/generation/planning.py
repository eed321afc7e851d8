"""What a job generates: its shard of the examples, and each example's attempts as keyed plans.

Attempt 1 has ``max_new_tokens``; the truncation rule (spec section 4) gives an attempt 1 that stopped on
the token limit without a correct answer an attempt 2 with the model's context as budget
(``inference.truncation_rerun``: a continuation of attempt 1's tokens, or a regeneration).  A plan's store
key is everything that decides its tokens (``procexec.config.keys``): equal keys, equal generations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from procexec.config.keys import canonical_sha256, sampling_identity
from procexec.engine.tokenizer import RenderedPrompt
from procexec.errors import ProcexecError
from procexec.generation.backend import Backend
from procexec.generation.job_settings import JobSettings
from procexec.io.jsonl import read_jsonl
from procexec.records import Example, GenerationRecord


def load_examples(datasets_dir: Path, datasets: list[str]) -> list[Example]:
    examples: list[Example] = []
    for dataset in datasets:
        path = datasets_dir / f"{dataset}.jsonl"
        for number, obj in read_jsonl(path):
            example = Example.from_json(obj, f"{path}:{number}")
            if example.dataset != dataset:
                raise ProcexecError(f"{path}:{number}: example of dataset '{example.dataset}', expected '{dataset}'")
            examples.append(example)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ProcexecError("duplicate example ids across the given datasets")
    return examples


def order_key(example: Example) -> tuple[int, str, int]:
    return (example.length, example.dataset, example.index)


def shard_slice(examples: list[Example], shard: int, num_shards: int) -> list[Example]:
    """Shard ``shard`` (1-based) of ``num_shards``: every N-th example in (length, dataset, index) order.

    Striding instead of cutting contiguous blocks gives every shard the same
    mix of lengths, so shards of one model take about the same time.
    """
    if not 1 <= shard <= num_shards:
        raise ProcexecError(f"--shard {shard} is outside 1..{num_shards}")
    return sorted(examples, key=order_key)[shard - 1 :: num_shards]


def submission_order(plan: Planned) -> tuple[int, int, str, int]:
    """The order a shard submits its generations in: the longest procedures first, an attempt 2 (a resumed
    shard's) before the attempts 1 of its length, then as the shard is ordered.

    Long procedures truncate most, rerun longest and loop most: submitted last, they would leave every shard
    ending on a nearly empty batch that decodes them alone (a DS-685 continuation to its context is over an
    hour on 8 GPUs).  Started first, they run beside the short ones, which fill the batch to the end.  Only the
    order changes: which examples a shard holds (``shard_slice``), the store keys and the shard file's order
    (``order_key``) do not (``benchmarks/bench_shard_order.py`` measures both orders).
    """
    return (-plan.example.length, -plan.attempt, plan.example.dataset, plan.example.index)


@dataclass
class Planned:
    """One generation the job needs: its example, prompt, budget, key and (continuations) what it extends."""

    example: Example
    attempt: int
    prompt: RenderedPrompt
    max_tokens: int
    requested_tokens: int  # the budget before clamping to the engine's context
    key: str
    continued: GenerationRecord | None = None  # a continuation: the stored attempt it extends


class Planner:
    """A job's plans and keys: each generation's budget and store key, and the truncation rule's attempt 2."""

    def __init__(self, settings: JobSettings, backend: Backend, answered: Callable[[str, Example], bool]):
        """``answered``: the truncation rule's question, scoring's versioned answer (procexec.scoring.truncation)."""
        self.settings = settings
        self.key = settings.model_key
        self.backend = backend
        self.answered = answered
        self.truncation_rerun = settings.truncation_rerun
        if self.truncation_rerun == "continue" and not backend.supports_continuation:
            self.truncation_rerun = "regenerate"
        self.identity = backend.identity()
        self._answers: dict[tuple[str, str], bool] = {}  # (attempt-1 key, example id): has a correct answer

    def budget(self, example: Example, prompt: RenderedPrompt, requested: int) -> int:
        """``requested`` new tokens, clamped to what the engine's context leaves after the prompt."""
        room = self.backend.max_model_len() - (prompt.num_tokens or 0)
        if room <= 0:
            raise ProcexecError(
                f"{example.id}: the prompt has {prompt.num_tokens} tokens, models.{self.key}.max_model_len "
                f"is {self.backend.max_model_len()}: no room to generate"
            )
        return min(requested, room)

    def plan(
        self,
        example: Example,
        attempt: int,
        prompt: RenderedPrompt,
        requested: int,
        extends: tuple[Planned, GenerationRecord] | None = None,
    ) -> Planned:
        """Plan one generation; a continuation names the attempt it extends (its plan and stored record)."""
        already = 0 if extends is None else extends[1].num_generated_tokens or 0
        max_tokens = self.budget(example, prompt, requested) - already
        key = canonical_sha256(
            {
                "engine": self.identity,
                "prompt_sha256": prompt.sha256,
                "prompt_tokens": prompt.num_tokens,
                "sampling": {
                    **self.settings.sampling.to_json(),
                    "max_tokens": max_tokens,
                    **sampling_identity(self.settings.model),
                    **({"repetition_detection": self.guard(attempt)} if self.guard(attempt) else {}),
                },
                "attempt": attempt,
                "continues": None if extends is None else extends[0].key,
            }
        )
        return Planned(example, attempt, prompt, max_tokens, requested, key, None if extends is None else extends[1])

    def guard(self, attempt: int) -> dict[str, int] | None:
        """The repetition guard of an attempt's requests: the configured one on reruns, none on attempt 1."""
        return self.settings.rerun_repetition_guard if attempt > 1 else None

    def rerun_of(self, item: Planned, record: GenerationRecord) -> Planned | None:
        """The attempt-2 plan for a truncated, incorrect attempt 1, given its record (just made, or read from
        the store); None when not needed or pointless.

        The budget is the model's context minus the prompt, capped by the
        engine's ``max_model_len``.  When that leaves no more room than attempt
        1 had, a greedy rerun would repeat attempt 1 token for token: skipped.
        ``continue`` submits attempt 1's tokens after the prompt and decodes
        only the rest; ``regenerate`` decodes everything again.
        """
        if record.finish_reason != "length" or self.has_answer(item, record):
            return None
        requested = self.settings.max_context - (item.prompt.num_tokens or 0)
        if self.budget(item.example, item.prompt, requested) <= item.max_tokens:
            return None
        if self.truncation_rerun == "continue" and record.token_ids is not None:
            return self.plan(item.example, 2, item.prompt, requested, extends=(item, record))
        return self.plan(item.example, 2, item.prompt, requested)

    def has_answer(self, item: Planned, record: GenerationRecord) -> bool:
        """The truncation check's answer for ``item``'s attempt 1, asked once: the attempt-2 pass after a
        submission that queued attempts 2 as they came asks again of every truncated attempt 1."""
        asked = (item.key, item.example.id)
        if asked not in self._answers:
            self._answers[asked] = self.answered(record.text, item.example)
        return self._answers[asked]

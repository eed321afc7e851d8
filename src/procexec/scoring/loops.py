"""Repetition loops at the tail of a generation: exact n-gram repetition over token ids (or characters).

A generation *ends in a loop* when its last ``span`` elements (token ids; the
characters of the text where a record has no ids, e.g. an endpoint's chat route)
are one block of ``period`` elements repeated: ``x[i] == x[i + period]`` over the
whole span, the span holding at least ``min_count`` whole periods and at least
``min_span`` elements, with ``min_period <= period <= max_period``.  The period
reported is the smallest that qualifies (the fundamental one).  A partial period
at the very end counts (a generation cut by ``max_new_tokens`` stops mid-block).

It is the test of vLLM 0.32's own ``check_sequence_repetition``
(``vllm/v1/core/sched/utils.py``: the last ``pattern_len`` tokens against the
``min_count - 1`` blocks before them) plus a minimum span, so that short
legitimate repeats (a run of ``0`` digits, ``\n\n\n\n``) are not loops:

* token ids: periods 1..512 tokens, >= 4 repetitions, >= 256 tokens in all;
* characters: periods 1..2,048 characters, >= 4 repetitions, >= 1,024 characters
  (about the same span at ~4 characters a token).

Only the tail is checked: a model that repeated itself and then stopped on its
own is not looping when it ended; one still repeating when ``max_new_tokens``
(or the guard) cut it is.  docs/scoring.md gives the definition beside the
score columns ``looping`` and ``loop_period``.

A generation is judged once, by the job that makes its record, which carries the
verdict (``provenance.loop``); the progress line, the store's index, ``procexec
status`` and the score row all read that.  A record without one (made before
records carried it, or outside a job) is judged by ``record_loop`` when read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from procexec.records import GenerationRecord, Loop


@dataclass(frozen=True)
class LoopThresholds:
    min_period: int
    max_period: int
    min_count: int  # whole repetitions of the period inside the span
    min_span: int  # elements in the periodic tail

    def __post_init__(self) -> None:
        if not 1 <= self.min_period <= self.max_period or self.min_count < 2 or self.min_span < 1:
            raise ValueError(f"loop thresholds out of range: {self}")


TOKEN_THRESHOLDS = LoopThresholds(min_period=1, max_period=512, min_count=4, min_span=256)
CHAR_THRESHOLDS = LoopThresholds(min_period=1, max_period=2048, min_count=4, min_span=1024)


def periodic_tail(seq: Sequence[Any], period: int, limit: int | None = None) -> int:
    """Length of the longest suffix of ``seq`` with period ``period`` (0 when shorter than two periods).

    With ``limit`` the count stops once the suffix reaches ``limit`` elements.
    """
    n = len(seq)
    if n < 2 * period:
        return 0
    stop = n - period if limit is None else min(n - period, max(limit - period, 0))
    run = 0
    while run < stop and seq[n - 1 - run] == seq[n - 1 - run - period]:
        run += 1
    return run + period if run >= period else 0


def find_loop(seq: Sequence[Any], thresholds: LoopThresholds, basis: str) -> Loop | None:
    """The loop at the tail of ``seq`` under ``thresholds`` (smallest qualifying period), or None."""
    n = len(seq)
    for period in range(thresholds.min_period, min(thresholds.max_period, n // 2) + 1):
        need = max(thresholds.min_count * period, thresholds.min_span)
        if need > n:
            continue
        if periodic_tail(seq, period, limit=need) >= need:
            return Loop(period=period, span=periodic_tail(seq, period), basis=basis)
    return None


def detect_loop(
    token_ids: Sequence[int] | None,
    text: str,
    token_thresholds: LoopThresholds = TOKEN_THRESHOLDS,
    char_thresholds: LoopThresholds = CHAR_THRESHOLDS,
) -> Loop | None:
    """The loop a generation ends in: over its token ids when it has them, else over its text's characters."""
    if token_ids:
        return find_loop(token_ids, token_thresholds, "tokens")
    return find_loop(text, char_thresholds, "chars")


def record_loop(record: GenerationRecord) -> Loop | None:
    """The loop ``record`` ends in: the verdict it carries, or, for a record that carries none, judged now."""
    return record.loop if record.judged else detect_loop(record.token_ids, record.text)

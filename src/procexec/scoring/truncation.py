"""The truncation rule's question (spec section 4): does a truncated generation already hold the answer?

The generation job asks it of every attempt 1 that stopped on the token limit; a "no"
buys an attempt 2.  The answer is scoring's (answer spans, the paper's rounding
rule), so the rule lives here and the generation stage is handed it.  Its version is part
of each generation job's rerun parameters (``procexec.cluster.workflow``): a
change to what counts as answered reruns the generation jobs, which re-decide
which examples get an attempt 2 (their generations stay in the store).
"""

from __future__ import annotations

from procexec.benchmark.executor import execute, parse_value
from procexec.records import Example
from procexec.scoring.extract import extract_answers, rounded_match

#: Bump when ``has_correct_answer`` can answer differently for some text.
TRUNCATION_CHECK_VERSION = 1


def has_correct_answer(text: str, example: Example) -> bool:
    """Any parseable answer span of ``text`` matching the reference (the paper's rounding rule)."""
    expected = parse_value(execute(example).final)
    return any(s.value is not None and rounded_match(s.value, expected) for s in extract_answers(text))

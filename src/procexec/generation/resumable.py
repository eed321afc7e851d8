"""Whether what a store holds can stand for a generation: one verdict, which ``infer`` applies before it reuses
a finished record or continues a partial one, and ``procexec status --verify`` applies to name what the next
``infer`` will drop.

A record a job cannot use is dropped and made again, never sent on: its frame damaged (CRC) or not a record
this procexec wrote, its JSON failing ``GenerationRecord``'s checks, more new tokens than its budget, or a
token id outside the model's vocabulary (vLLM fails a request whose prompt holds one, and a continuation or
a resumed partial sends the stored ids after the prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from procexec.config.keys import canonical_sha256
from procexec.errors import ProcexecError
from procexec.generation.store import Entry, MisplacedFrame, frame_place, read_record
from procexec.records import GenerationRecord


def outside_vocabulary(ids: Sequence[int], vocabulary: int | None) -> str | None:
    """The first of ``ids`` a vocabulary of ``vocabulary`` ids (0 .. n-1) lacks, as a problem (None: every id
    is in it, or the vocabulary is not known)."""
    if vocabulary is None or not ids or 0 <= min(ids) <= max(ids) < vocabulary:
        return None
    outside = next(i for i in ids if not 0 <= i < vocabulary)
    return f"token id {outside} is outside the model's vocabulary of {vocabulary}"


def finished_problem(record: GenerationRecord, budget: int | None, vocabulary: int | None) -> str | None:
    """Why a finished ``record`` cannot be its generation's on this model (None: it can).  ``budget``: the new
    tokens its plan allows (None: not known here)."""
    new_tokens = (record.num_generated_tokens or 0) - (record.provenance.get("continued_tokens") or 0)
    if budget is not None and new_tokens > budget:
        return f"{new_tokens} tokens generated for a budget of {budget}"
    return None if record.token_ids is None else outside_vocabulary(record.token_ids, vocabulary)


def partial_problem(obj: dict[str, Any], key: str, budget: int | None, vocabulary: int | None) -> str | None:
    """Why the partial record ``obj`` cannot continue generation ``key`` (None: it can): another generation's,
    no tokens, no room left in ``budget`` (None: not known here), an id outside the vocabulary."""
    ids = obj.get("token_ids")
    if obj.get("partial_of") != key or not isinstance(ids, list):
        return "not this generation's tokens"
    if not ids or (budget is not None and len(ids) >= budget):
        return f"{len(ids)} tokens" + ("" if budget is None else f" for a budget of {budget}")
    return outside_vocabulary(ids, vocabulary)


def stated_budget(record: GenerationRecord) -> int | None:
    """The budget a record says its request had (``provenance.sampling.max_tokens``; None: it says none)."""
    sampling = record.provenance.get("sampling")
    budget = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    return budget if type(budget) is int else None


def partial_key(key: str) -> str:
    """The store key of the partial record of generation ``key`` (``key in store`` still means finished)."""
    return canonical_sha256({"partial_of": key})


def dropped_entries(
    directory: Path, entries: Iterable[Entry], vocabulary: int | None, warn: Callable[[str], None]
) -> set[str]:
    """The keys of ``entries`` (a store's latest, partials included) that ``infer`` will drop, each told to
    ``warn`` in one line.  Read without the job's plan (no prompt is rendered): a finished record is held to
    the budget it states it was sent with, a partial one to the generation its key is derived from.  A partial
    record of a generation since finished is never read again (no infer resumes it): not checked."""
    entries = list(entries)
    stored = {e.key for e in entries}
    superseded = {partial_key(e.key) for e in entries if not e.partial}
    dropped = set()
    for entry in entries:
        if entry.key in superseded:
            continue
        where, obj = frame_place(directory, entry), None
        try:
            obj = read_record(directory, entry)
            if entry.partial:  # its generation is the one whose partial key it is stored under
                generation = obj.get("partial_of")
                if not isinstance(generation, str) or partial_key(generation) != entry.key:
                    generation = ""  # not owned
                problem = partial_problem(obj, generation, None, vocabulary)
            else:
                record = GenerationRecord.from_json(obj, where)
                problem = finished_problem(record, stated_budget(record), vocabulary)
            if problem is None:
                continue
            problem = f"{where}: {problem}"
        except MisplacedFrame as exc:  # a damaged index entry: no generation is stored under its key
            dropped.add(entry.key)
            held = "stored under its own key too" if exc.frame_key in stored else "made again by the next infer"
            warn(f"{exc}: a damaged index entry, left out (the generation its frame holds is {held})")
            continue
        except ProcexecError as exc:
            problem = str(exc)
        dropped.add(entry.key)
        example = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else "its example"
        again = "from the start" if entry.partial else "again"
        warn(f"{problem}; the next infer drops it and generates {example} (attempt {entry.attempt}) {again}")
    return dropped

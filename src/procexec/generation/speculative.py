"""Speculative decoding judged on a model's own outputs: what drafting accepts, what it speeds, what it changes.

One function (``speculative_figures``) computes the figures for both places that show them:
``benchmarks/bench_speculative.py`` (two engines on the same prompt ids) and the pilot's report
(``pilot_speculative``: the pilot's slice of a model generated plain and with drafting, into two
stores; ``procexec speculative-pilot`` compares their shards, and ``procexec report --speculative``
hands the files' rows, checked by ``read_pilot_figures``, to the report, which reads no store).  A generation is identical when its
token ids (attempt 1, then attempt 2 where there is one) equal plain greedy's; for the others the
first differing position says how early the drafted engine's numerics flipped an argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from procexec.errors import ProcexecError
from procexec.generation.collect import model_records
from procexec.generation.engine_stats import EngineStats, read_stats
from procexec.generation.store import writer_stage
from procexec.io.jsonl import read_json


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two id sequences differ (the shorter's length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def speculative_figures(
    plain: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]], plain_run: EngineStats, drafted_run: EngineStats
) -> dict[str, Any]:
    """The figures of one model: ``plain[i]`` and ``drafted[i]`` are the same prompt's token ids without and with
    drafting; each run's decoded tokens and seconds give its rate, ``drafted_run``'s counters the acceptance."""
    differ = [first_difference(a, b) for a, b in zip(plain, drafted, strict=True) if list(a) != list(b)]
    plain_rate, drafted_rate = plain_run.tokens_per_s, drafted_run.tokens_per_s
    return {
        "generations": len(plain),
        "acceptance_rate": _rounded(drafted_run.acceptance_rate, 3),
        "mean_acceptance_length": _rounded(drafted_run.mean_acceptance_length, 3),
        "drafts": drafted_run.drafts,
        "draft_tokens": drafted_run.draft_tokens,
        "accepted_tokens": drafted_run.accepted_tokens,
        "plain_tok_s": _rounded(plain_rate, 2),
        "speculative_tok_s": _rounded(drafted_rate, 2),
        "speed_ratio": None if not plain_rate or drafted_rate is None else round(drafted_rate / plain_rate, 3),
        "identical": len(plain) - len(differ),
        "identical_share": round(1 - len(differ) / len(plain), 3) if plain else None,
        "first_difference_at": differ,
    }


def _generations(shards: Sequence[Path], model: str) -> tuple[dict[str, list[int]], Any]:
    """Example id -> its token ids, attempt 1 then attempt 2, from a model's shard files; and the
    ``speculative_config`` their engine ran with (``provenance.engine``)."""
    attempts: dict[str, dict[int, list[int]]] = {}
    spec = None
    for shard in shards:
        for where, record in model_records(shard, model):
            if record.token_ids is None:
                raise ProcexecError(f"{where}: {record.id} has no token ids to compare (an endpoint's record?)")
            attempts.setdefault(record.id, {})[record.attempt] = record.token_ids
            spec = (record.provenance.get("engine") or {}).get("speculative_config")
    return {rid: [t for _, ids in sorted(by.items()) for t in ids] for rid, by in attempts.items()}, spec


def _stage_stats(store_dir: Path, stage: str) -> EngineStats:
    """The engine statistics a stage's shards kept in a store (``procexec.generation.engine_stats``)."""
    files = sorted((store_dir / "stats").glob("*.json")) if store_dir.is_dir() else []
    return sum((read_stats(p) for p in files if writer_stage(p.stem) == stage), EngineStats())


def pilot_figures(
    model: str, plain_shards: Sequence[Path], drafted_shards: Sequence[Path], plain_store: Path, drafted_store: Path
) -> dict[str, Any]:
    """One model's figures from the pilot's two halves: their shards paired by example, their stores' pilot
    statistics (decode rates; the speculative half's draft counters)."""
    (plain, _), (drafted, spec) = _generations(plain_shards, model), _generations(drafted_shards, model)
    if set(plain) != set(drafted):
        lacking = sorted(set(plain) ^ set(drafted))
        raise ProcexecError(
            f"model {model}: the pilot's plain and speculative shards hold different examples ({len(lacking)}, "
            f"e.g. {lacking[0]})"
        )
    ids = sorted(plain)
    figures = speculative_figures(
        [plain[i] for i in ids],
        [drafted[i] for i in ids],
        _stage_stats(plain_store, "pilot"),
        _stage_stats(drafted_store, "pilot"),
    )
    return {"model": model, "speculative_config": spec, **figures}


def read_pilot_figures(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The report's rows: each file ``procexec speculative-pilot`` wrote, by model (one lacking a figure the
    report shows is refused in one line naming the file and the figures)."""
    needed = {"model", "speculative_config", *speculative_figures([], [], EngineStats(), EngineStats())}
    rows = [read_json(path, what="speculative pilot figures (procexec speculative-pilot --out)") for path in paths]
    for path, row in zip(paths, rows, strict=True):
        lacking = sorted(needed - set(row))
        if lacking:
            raise ProcexecError(
                f"{path}: not the figures of procexec speculative-pilot (no {', '.join(lacking)}) (--speculative)"
            )
    return sorted(rows, key=lambda row: row["model"])

"""What inference costs: decoded tokens and GPU-hours, from a stated output-length and truncation model.

One model for two readers: ``benchmarks/gpu_hours.py`` (the study's GPU-hour
account, ``regenerate`` against ``continue``) and the workflow (each inference
shard's SLURM runtime from its share of the work).  Every number here is an
assumption, stated in ``docs/cluster.md`` with its source; measure one shard
and set ``throughput_tok_s`` in ``config.yaml`` to replace the guess.

The output model, per procedure length L (5..95 steps):

* a generation that stops on its own has ``mean_tokens(L)`` tokens;
* ``truncation(L)`` of them hit ``max_new_tokens`` instead (reasoning models
  on long procedures: peers report 19-37% capped at 95 steps);
* a truncated one, given more room (the rerun), needs ``rerun_extra`` tokens
  more on average, as far as the context allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from procexec.config import expand_suite
from procexec.errors import ProcexecError
from procexec.inference.store import Store, entries_of
from procexec.io.files import read_text
from procexec.scoring.loops import detect_loop


@dataclass(frozen=True)
class OutputModel:
    base_tokens: float  # mean output of an untruncated generation at L = 0 ...
    tokens_per_step: float  # ... growing linearly with the procedure length
    truncation_at_5: float
    truncation_at_95: float
    rerun_extra: float  # mean tokens a truncated generation needs beyond max_new_tokens

    def mean_tokens(self, length: int) -> float:
        return self.base_tokens + self.tokens_per_step * length

    def truncation(self, length: int) -> float:
        share = min(max((length - 5) / 90, 0.0), 1.0)
        return self.truncation_at_5 + (self.truncation_at_95 - self.truncation_at_5) * share


# Reasoning models (thinking traces of thousands of tokens): 2.5k tokens at 5 steps to 11.5k at 95,
# 2% truncated at 5 steps rising to 30% at 95 (peers: 19-37% capped at 95 steps).
REASONING = OutputModel(base_tokens=2000, tokens_per_step=100, truncation_at_5=0.02, truncation_at_95=0.30,
                        rerun_extra=12000)
# Instruction models without a thinking phase (MI-7, the demo's SmolLM2): short answers, rarely capped.
INSTRUCT = OutputModel(base_tokens=300, tokens_per_step=20, truncation_at_5=0.0, truncation_at_95=0.01,
                       rerun_extra=2000)


@dataclass(frozen=True)
class DecodeTokens:
    attempt1: float
    attempt2: float

    @property
    def total(self) -> float:
        return self.attempt1 + self.attempt2


def expected_decode(length: int, output: OutputModel, max_new_tokens: int, context_room: int,
                    policy: str) -> DecodeTokens:
    """Expected tokens decoded for one example of ``length`` steps.

    ``context_room`` is what attempt 2 may use in all (max_context - prompt); a
    rerun happens only when it exceeds ``max_new_tokens`` (else it would repeat
    attempt 1).  ``regenerate`` decodes attempt 1's tokens again, ``continue``
    does not, ``off`` has no attempt 2.
    """
    p = output.truncation(length)
    first = (1 - p) * min(output.mean_tokens(length), max_new_tokens) + p * max_new_tokens
    if policy == "off" or context_room <= max_new_tokens:
        return DecodeTokens(first, 0.0)
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    rerun = extra if policy == "continue" else max_new_tokens + extra
    return DecodeTokens(first, p * rerun)


def output_model(model: dict) -> OutputModel:
    """The output model of a configured model (``reasoning: false`` for instruction models)."""
    return REASONING if model.get("reasoning", True) else INSTRUCT


def shard_runtime_minutes(model: dict, inference: dict, lengths: list[int], examples_per_length: int,
                          datasets: int, shards: int, cap: int, prompt_tokens: int = 700) -> int:
    """SLURM runtime of one inference shard: its share of the expected decode at the model's throughput.

    1.5 x (15 minutes of start-up + expected decode time), at least 30 minutes and
    at most ``cap`` (the partition's limit: a shard the limit stops resumes on the next run).
    """
    max_new = int(model.get("max_new_tokens", inference["max_new_tokens"]))
    room = int(model.get("max_context", model["max_model_len"])) - prompt_tokens
    out = output_model(model)
    tokens = sum(expected_decode(length, out, max_new, room, inference["truncation_rerun"]).total
                 for length in lengths) * examples_per_length * datasets / shards
    minutes = 1.5 * (15 + tokens / float(model["throughput_tok_s"]) / 60)
    return int(min(cap, max(30, round(minutes))))


# ---------------------------------------------------------------------------------------------
# The study's projection (`procexec cost`): tokens from the stated output model or from a
# smoke/pilot's store, GPU-hours from a bandwidth model of decode at the in-flight context.
# ---------------------------------------------------------------------------------------------

PROMPT_TOKENS = 700  # the Appendix B prompt plus a 95-step procedure is ~600-1,000 tokens
ARCHITECTURE_FILE = Path(__file__).resolve().parents[1] / "data" / "architecture.yaml"
STATED_EFFICIENCY_RANGE = (0.5, 0.9)  # the interval of a projection without measurements
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class Hardware:
    hbm_bytes_per_s: float
    memory_bytes: float
    gpu_memory_utilization: float
    efficiency: float
    max_num_seqs: int


@dataclass(frozen=True)
class Architecture:
    kv_bytes_per_token: float
    weight_bytes: float
    kv_replicated: bool = False  # MLA: every tensor-parallel rank caches the whole latent


def load_architecture(path: str | Path = ARCHITECTURE_FILE) -> tuple[Hardware, dict[str, Architecture]]:
    """The hardware constants and per-abbrev architecture numbers of ``path`` (sources in the file)."""
    data = yaml.safe_load(read_text(path))
    try:
        hw = data["hardware"]
        hardware = Hardware(float(hw["hbm_bytes_per_s"]), float(hw["memory_bytes"]),
                            float(hw["gpu_memory_utilization"]), float(hw["efficiency"]), int(hw["max_num_seqs"]))
        models = {str(abbrev): Architecture(float(m["kv_bytes_per_token"]), float(m["weight_gb"]) * 1e9,
                                            bool(m.get("kv_replicated", False)))
                  for abbrev, m in data["models"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProcexecError(f"{path}: not an architecture file ({type(exc).__name__}: {exc})") from None
    return hardware, models


def bandwidth_throughput(arch: Architecture, hardware: Hardware, gpus: int, context: float,
                         efficiency: float | None = None) -> float:
    """Decode tokens/s of one engine on ``gpus`` GPUs at a mean in-flight context of ``context`` tokens.

    Per GPU and step, the weights (its 1/gpus share) are read once for the whole batch and
    every sequence's KV cache is read once: step time = (W/g + b x C x kv) / (efficiency x HBM
    bandwidth).  The batch b is what the KV pool holds (the GPU's memory x utilisation, less its
    weights), at most ``max_num_seqs``; tokens/s = b / step time.
    """
    eff = hardware.efficiency if efficiency is None else efficiency
    weights = arch.weight_bytes / gpus
    kv = arch.kv_bytes_per_token if arch.kv_replicated else arch.kv_bytes_per_token / gpus
    pool = hardware.memory_bytes * hardware.gpu_memory_utilization - weights
    if pool <= 0:
        raise ProcexecError(f"weights of {arch.weight_bytes / 1e9:.0f} GB do not fit {gpus} GPU(s)")
    batch = min(float(hardware.max_num_seqs), pool / (kv * max(context, 1.0)))
    step = (weights + batch * max(context, 1.0) * kv) / (eff * hardware.hbm_bytes_per_s)
    return batch / step


@dataclass(frozen=True)
class Work:
    """Decoded tokens of one phase and their token-weighted mean in-flight context."""

    tokens: float
    context: float

    @staticmethod
    def of(pieces: list[tuple[float, float, float]]) -> Work:
        """From (weight, tokens decoded, context before the first of them) pieces: each token at its own context."""
        tokens = sum(w * n for w, n, _ in pieces)
        if tokens <= 0:
            return Work(0.0, 0.0)
        return Work(tokens, sum(w * n * (c + n / 2) for w, n, c in pieces) / tokens)


def stated_work(length: int, output: OutputModel, max_new_tokens: int, context_room: int, policy: str,
                prompt_tokens: int = PROMPT_TOKENS) -> tuple[Work, Work]:
    """(attempt 1, rerun) of one example under the stated output model (``expected_decode``'s tokens)."""
    p = output.truncation(length)
    short = min(output.mean_tokens(length), max_new_tokens)
    first = Work.of([(1 - p, short, prompt_tokens), (p, max_new_tokens, prompt_tokens)])
    if policy == "off" or context_room <= max_new_tokens:
        return first, Work(0.0, 0.0)
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    if policy == "continue":
        return first, Work.of([(p, extra, prompt_tokens + max_new_tokens)])
    return first, Work.of([(p, max_new_tokens + extra, prompt_tokens)])


@dataclass
class Measured:
    """One model's measured examples: per procedure length, (attempt-1 tokens, rerun tokens) per example."""

    examples: dict[int, list[tuple[int, int]]]
    truncated: int  # attempt-1 generations cut by max_new_tokens
    reruns: int
    looping: int  # generations (any attempt) ending in a loop (procexec.scoring.loops)
    generations: int
    tokens_per_s: float | None  # decode rate of one engine, from the store's commit times
    context: float  # token-weighted mean in-flight context of what was measured

    @property
    def n(self) -> int:
        return sum(len(v) for v in self.examples.values())


def read_measured(store_dir: Path, prompt_tokens: int = PROMPT_TOKENS) -> Measured | None:
    """What a smoke/pilot stored for one model (None when the store is absent or empty).

    Tokens: a continuation's record counts its attempt's tokens too (``provenance.continued_tokens``),
    which are subtracted.  Rate: per writer (one shard job), the tokens committed after its first
    commit over the time from its first commit to its last; the writers' sums divided.
    """
    if not store_dir.is_dir():
        return None
    store = Store(store_dir, "procexec-cost-reader")
    if store.load() == 0:
        return None
    per_example: dict[str, dict[int, dict[str, Any]]] = {}
    commits: dict[str, list[tuple[float, int]]] = {}
    pieces: list[tuple[float, float, float]] = []
    looping = generations = 0
    seen: set[str] = set()
    for seg in sorted(store_dir.glob("*.seg")):
        for entry in entries_of(seg):
            if entry.key in seen:
                continue
            seen.add(entry.key)
            record = store.get(entry.key)
            if record is None:
                continue
            generations += 1
            continued = int((record.get("provenance") or {}).get("continued_tokens") or 0)
            new = int(record.get("num_generated_tokens") or 0) - continued
            per_example.setdefault(str(record["id"]), {})[int(record["attempt"])] = {
                "length": int(record["length"]), "new": new, "finish": record["finish_reason"]}
            commits.setdefault(entry.writer, []).append((entry.committed, new))
            pieces.append((1.0, float(new), float((record.get("prompt_tokens") or prompt_tokens) + continued)))
            looping += detect_loop(record.get("token_ids"), str(record.get("text") or "")) is not None
    examples: dict[int, list[tuple[int, int]]] = {}
    truncated = reruns = 0
    for attempts in per_example.values():
        if 1 not in attempts:
            continue
        first = attempts[1]
        rerun = sum(a["new"] for k, a in attempts.items() if k > 1)
        truncated += first["finish"] == "length"
        reruns += len(attempts) > 1
        examples.setdefault(first["length"], []).append((first["new"], rerun))
    tokens = span = 0.0
    for items in commits.values():
        start = min(t for t, _ in items)
        end = max(t for t, _ in items)
        if end > start:
            tokens += sum(n for t, n in items if t > start)
            span += end - start
    return Measured(examples, truncated, reruns, looping, generations, tokens / span if span > 0 else None,
                    Work.of(pieces).context)


def measured_tokens(examples: dict[int, list[tuple[int, int]]], lengths: list[int]) -> tuple[list[float], list[float]]:
    """Per configured length, the mean (attempt-1, rerun) tokens of one example.

    Lengths without a measured example are interpolated linearly between measured ones (held
    constant beyond them).
    """
    measured = sorted(examples)
    first = [sum(a for a, _ in examples[L]) / len(examples[L]) for L in measured]
    rerun = [sum(r for _, r in examples[L]) / len(examples[L]) for L in measured]
    return ([float(np.interp(L, measured, first)) for L in lengths],
            [float(np.interp(L, measured, rerun)) for L in lengths])


@dataclass
class Projection:
    model: str
    abbrev: str
    gpus: int
    shards: int
    basis: str  # "stated" | "measured"
    examples: int  # of the full study
    attempt1_tokens: float
    rerun_tokens: float
    tokens_interval: tuple[float, float]
    context_attempt1: float
    context_rerun: float
    tokens_per_s: float | None  # the projection's engine rate (None: no architecture numbers, no measurement)
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    constant_gpu_hours: float  # the old figure: the same tokens at config.yaml's throughput_tok_s
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        return self.attempt1_tokens + self.rerun_tokens

    @property
    def wall_hours(self) -> float:
        """With all of the model's shards running at once."""
        return self.gpu_hours / self.gpus / self.shards

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out.update(tokens=self.tokens, wall_hours=self.wall_hours,
                   wall_hours_interval=tuple(h / self.gpus / self.shards for h in self.gpu_hours_interval))
        return out


def _engine_hours(tokens1: float, tokens2: float, rate1: float, rate2: float) -> float:
    return (tokens1 / rate1 + (tokens2 / rate2 if tokens2 else 0.0)) / 3600


def project_model(config: dict, key: str, n_datasets: int, measured: Measured | None = None,
                  architecture: tuple[Hardware, dict[str, Architecture]] | None = None,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Projection:
    """One model's projection for the full study (``config``'s suite, rerun policy and budgets)."""
    suite, inference = config["suite"], config["inference"]
    model = config["models"][key]
    hardware, archs = architecture or load_architecture()
    arch = archs.get(model["abbrev"])
    gpus, shards = max(int(model["gpus"]), 1), max(int(model.get("shards", 1)), 1)  # a CPU engine: one "GPU"
    policy = inference["truncation_rerun"]
    max_new = int(model.get("max_new_tokens", inference["max_new_tokens"]))
    room = int(model.get("max_context", model["max_model_len"])) - PROMPT_TOKENS
    lengths = [int(L) for L in suite["lengths"]]
    per_length = int(suite["examples_per_length"]) * n_datasets
    examples = per_length * len(lengths)
    constant = float(model["throughput_tok_s"])

    def rate(context: float, efficiency: float | None = None) -> float | None:
        return None if arch is None else bandwidth_throughput(arch, hardware, gpus, context, efficiency)

    out = output_model(model)
    works = [stated_work(L, out, max_new, room, policy) for L in lengths]
    c1 = Work.of([(1.0, w.tokens, 0.0) for w, _ in works])  # weights only; contexts below
    ctx1 = sum(w.tokens * w.context for w, _ in works) / max(c1.tokens, 1e-9)
    rt = sum(r.tokens for _, r in works)
    ctx2 = sum(r.tokens * r.context for _, r in works) / rt if rt else 0.0
    if measured is None or measured.n == 0:
        t1, t2 = c1.tokens * per_length, rt * per_length
        r1, r2 = rate(ctx1), rate(ctx2) if rt else None
        if r1 is None:
            hours = _engine_hours(t1, t2, constant, constant) * gpus
            interval = (hours, hours)
            tput = None
        else:
            hours = _engine_hours(t1, t2, r1, r2 or r1) * gpus
            lo_e, hi_e = STATED_EFFICIENCY_RANGE
            interval = (_engine_hours(t1, t2, rate(ctx1, hi_e), rate(ctx2 or ctx1, hi_e)) * gpus,
                        _engine_hours(t1, t2, rate(ctx1, lo_e), rate(ctx2 or ctx1, lo_e)) * gpus)
            tput = (t1 + t2) / (hours / gpus * 3600)
        return Projection(key, model["abbrev"], gpus, shards, "stated", examples, t1, t2, (t1 + t2, t1 + t2),
                          ctx1, ctx2, tput, hours, interval, (t1 + t2) / constant / 3600 * gpus)

    # measured: per length means (interpolated), the rate scaled from the measured context to the study's
    first, rerun = measured_tokens(measured.examples, lengths)
    t1, t2 = sum(first) * per_length, sum(rerun) * per_length
    if measured.tokens_per_s is not None:
        scale = 1.0 if arch is None else rate(ctx1) / rate(measured.context)
        base = measured.tokens_per_s * scale
    else:
        base = rate(ctx1) or constant

    def hours_of(a: float, b: float) -> float:
        return (a + b) / base / 3600 * gpus

    rng = np.random.default_rng(seed)
    totals = []
    for _ in range(resamples):
        sample = {L: [v[i] for i in rng.integers(0, len(v), len(v))] for L, v in measured.examples.items()}
        f, r = measured_tokens(sample, lengths)
        totals.append((sum(f) + sum(r)) * per_length)
    lo, hi = (float(q) for q in np.quantile(totals, [0.025, 0.975]))
    share = {"examples": measured.n, "generations": measured.generations,
             "truncated_share": measured.truncated / measured.n, "rerun_share": measured.reruns / measured.n,
             "loop_share": measured.looping / max(measured.generations, 1),
             "measured_tokens_per_s": measured.tokens_per_s, "measured_context": measured.context}
    return Projection(key, model["abbrev"], gpus, shards, "measured", examples, t1, t2, (lo, hi), ctx1, ctx2, base,
                      hours_of(t1, t2), (hours_of(lo, 0), hours_of(hi, 0)), (t1 + t2) / constant / 3600 * gpus,
                      share)


def project_study(config: dict, results: str | Path | None = None, seed: int = 0,
                  resamples: int = BOOTSTRAP_RESAMPLES) -> list[Projection]:
    """Every run model's projection; with ``results``, fitted from ``results/generations/<model>/store``."""
    n_datasets = len(expand_suite(config["suite"]))
    architecture = load_architecture()
    if results is not None and not Path(results).is_dir():
        raise ProcexecError(f"--measured {results}: not a directory (expected a results folder with generations/)")
    rows = []
    for key in config["run_models"]:
        measured = None if results is None else read_measured(Path(results) / "generations" / key / "store")
        rows.append(project_model(config, key, n_datasets, measured, architecture, resamples, seed))
    return rows


def format_projection(rows: list[Projection]) -> str:
    head = (f"{'model':<8} {'GPUs':>4} {'basis':<8} {'attempt1':>9} {'reruns':>8} {'ctx1':>7} {'ctx2':>7} "
            f"{'tok/s':>7} {'GPU-h':>8} {'GPU-h interval':>17} {'wall h':>7} {'GPU-h const':>11}")
    lines = [head]
    for r in rows:
        tput = "n/a" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"
        lines.append(f"{r.abbrev:<8} {r.gpus:>4} {r.basis:<8} {r.attempt1_tokens / 1e9:>8.2f}G "
                     f"{r.rerun_tokens / 1e9:>7.2f}G {r.context_attempt1:>7,.0f} {r.context_rerun:>7,.0f} {tput:>7} "
                     f"{r.gpu_hours:>8,.0f} {r.gpu_hours_interval[0]:>8,.0f}-{r.gpu_hours_interval[1]:<8,.0f} "
                     f"{r.wall_hours:>7,.1f} {r.constant_gpu_hours:>11,.0f}")
    total = sum(r.gpu_hours for r in rows)
    lo = sum(r.gpu_hours_interval[0] for r in rows)
    hi = sum(r.gpu_hours_interval[1] for r in rows)
    lines.append(f"all: {sum(r.attempt1_tokens for r in rows) / 1e9:.2f}G attempt-1 + "
                 f"{sum(r.rerun_tokens for r in rows) / 1e9:.2f}G rerun tokens; {total:,.0f} H200 GPU-hours "
                 f"({lo:,.0f}-{hi:,.0f}); constant throughput_tok_s: {sum(r.constant_gpu_hours for r in rows):,.0f}; "
                 f"wall (every model's shards at once, longest model): {max((r.wall_hours for r in rows), default=0):,.1f} h")
    return "\n".join(lines)

"""What inference costs: decoded tokens and GPU-hours, from a stated output-length and truncation model.

One model for two readers: ``procexec cost`` (the study's GPU-hour account, also
``benchmarks/gpu_hours.py``) and the workflow (each inference shard's SLURM
runtime from its share of the work).  Both decode at the rate of a bandwidth
model at the in-flight context, for the parallel layout the model runs
(tensor, data and expert parallel, speculative decoding).  Every number here is
an assumption, stated in ``docs/cluster.md`` with its source; a pilot's store
(``procexec cost --measured``) replaces the token volume and the rate.

The output model, per procedure length L (5..95 steps):

* a generation that stops on its own has ``mean_tokens(L)`` tokens;
* ``truncation(L)`` of them hit ``max_new_tokens`` instead (reasoning models
  on long procedures: peers report 19-37% capped at 95 steps);
* a truncated one, given more room (the rerun), needs ``rerun_extra`` tokens
  more on average, as far as the context allows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from procexec.benchmark.suite import expand_suite
from procexec.cluster.stages import SPECULATIVE_STORE
from procexec.config.model import Config, Inference, ModelBase, VllmServerModel
from procexec.engine.capacity import Capacity, KvFootprint, ParallelShape, capacity, parallel_shape, server_args
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import EngineStats, model_stats, shard_stats, speculative_label
from procexec.generation.store import Store, entries_of, study_segments, writer_stage
from procexec.io.files import read_text
from procexec.records import ends_looping
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
REASONING = OutputModel(
    base_tokens=2000, tokens_per_step=100, truncation_at_5=0.02, truncation_at_95=0.30, rerun_extra=12000
)
# Instruction models without a thinking phase (MI-7, the demo's SmolLM2): short answers, rarely capped.
INSTRUCT = OutputModel(
    base_tokens=300, tokens_per_step=20, truncation_at_5=0.0, truncation_at_95=0.01, rerun_extra=2000
)


def output_model(model: ModelBase) -> OutputModel:
    """The output model of a configured model (``reasoning: false`` for instruction models)."""
    return REASONING if model.reasoning else INSTRUCT


#: The token volume the interval of a stated projection covers: (tokens factor, reasoning models' truncation at
#: 95 steps) at its low and high end.  Truncation: the peers' 19-37% capped at 95 steps.  Tokens per generation
#: x0.5-x1.5: assumed (nothing measures these models on these procedures before the pilot; the paper reports no
#: token counts).
TOKEN_VOLUME_RANGE = ((0.5, 0.19), (1.5, 0.37))


def varied_output(output: OutputModel, tokens_factor: float, truncation_at_95: float) -> OutputModel:
    """``output`` with its generations ``tokens_factor`` times as long and, for a reasoning model, the given
    truncation at 95 steps (an instruction model's, under 2%, is kept)."""
    return replace(
        output,
        base_tokens=output.base_tokens * tokens_factor,
        tokens_per_step=output.tokens_per_step * tokens_factor,
        truncation_at_95=truncation_at_95 if output is REASONING else output.truncation_at_95,
    )


# ---------------------------------------------------------------------------------------------
# The decode rate: a bandwidth model of a model's GPUs at the in-flight context, for the parallel
# layout it runs (tensor, data and expert parallel; speculative decoding).
# ---------------------------------------------------------------------------------------------

PROMPT_TOKENS = 700  # the Appendix B prompt plus a 95-step procedure is ~600-1,000 tokens
ARCHITECTURE_FILE = Path(__file__).resolve().parents[1] / "data" / "architecture.yaml"
STATED_EFFICIENCY_RANGE = (0.5, 0.9)  # the interval of a projection without measurements
BOOTSTRAP_RESAMPLES = 1000
GIB = 2**30
#: A silence this long between one shard's commits is a shard not running (resumed later), never decoding: a
#: running shard commits every ``inference.store_commit_seconds`` (10) once a record has finished, and a pilot
#: runs hundreds of requests at once.
RUN_GAP_S = 600.0


@dataclass(frozen=True)
class Hardware:
    hbm_bytes_per_s: float
    memory_bytes: float
    gpu_memory_utilization: float
    efficiency: float
    max_num_seqs: int
    # the haircuts (architecture.yaml says where each comes from)
    runtime_overhead_bytes: float = 0.0  # per GPU, neither weights nor KV cache
    ep_step_overhead: float = 0.0  # expert parallel's all-to-all, as a share of the step
    filesystem_bytes_per_s: tuple[float, float] = (1e9, 2e9)  # the checkpoint's read at start-up, low and high
    warmup_s: float = 0.0  # a job's compile and CUDA-graph warm-up after the read


@dataclass(frozen=True)
class Architecture:
    kv_bytes_per_token: float  # layers that hold every token of the context
    weight_bytes: float
    kv_replicated: bool = False  # MLA: every tensor-parallel rank caches the whole latent
    expert_bytes: float = 0.0  # routed experts (within weight_bytes): spread over every GPU under data parallel
    draft_bytes: float = 0.0  # a built-in drafter (DeepSeek's MTP module), loaded only when speculating
    acceptance: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per method: accepted share per position
    sliding_bytes_per_token: float = 0.0  # sliding-window layers, each holding at most sliding_window tokens
    sliding_window: int = 0
    indexer_bytes_per_token: float = 0.0  # DeepSeek-V3.2's indexer key cache: whole on every TP rank
    attention_topk: int | None = None  # sparse attention: latent tokens one decode query reads
    runtime_overhead_bytes: float | None = None  # per GPU; None: the hardware's
    warmup_s: float | None = None  # None: the hardware's

    def kv_footprint(self, tp: int) -> KvFootprint:
        """What one sequence holds on each of ``tp`` ranks (the MLA latent and the indexer whole on each)."""
        split = 1 if self.kv_replicated else tp
        return KvFootprint(
            self.kv_bytes_per_token / split + self.indexer_bytes_per_token,
            self.sliding_bytes_per_token / split,
            self.sliding_window,
        )

    def kv_read(self, tp: int, context: float) -> float:
        """KV bytes one decode token reads on each rank at ``context``: what the sequence holds, but of a sparse
        model's latent only ``attention_topk`` tokens (its indexer's keys all)."""
        footprint = self.kv_footprint(tp)
        if self.attention_topk is None:
            return footprint.held(context)
        latent = self.kv_bytes_per_token / (1 if self.kv_replicated else tp)
        return footprint.held(context) - latent * max(context - self.attention_topk, 0.0)


@dataclass(frozen=True)
class Catalog:
    """architecture.yaml: the GPU, each model's numbers, and the rate of a model on vLLM's CPU engine."""

    hardware: Hardware
    models: dict[str, Architecture]
    cpu_tokens_per_s: float

    def with_haircuts(self, runtime_overhead_gib: float | None = None, ep_overhead: float | None = None) -> Catalog:
        """This catalog with the runtime overhead per GPU (every model's) and the expert-parallel step
        overhead set (``procexec cost --runtime-overhead-gib / --ep-overhead``); None keeps the stated one."""
        hardware, models = self.hardware, self.models
        if runtime_overhead_gib is not None:
            hardware = replace(hardware, runtime_overhead_bytes=runtime_overhead_gib * GIB)
            models = {k: replace(a, runtime_overhead_bytes=None) for k, a in models.items()}
        if ep_overhead is not None:
            hardware = replace(hardware, ep_step_overhead=ep_overhead)
        return replace(self, hardware=hardware, models=models)


@functools.lru_cache(maxsize=4)
def load_architecture(path: str | Path = ARCHITECTURE_FILE) -> Catalog:
    """The hardware constants and per-abbrev architecture numbers of ``path`` (sources in the file)."""
    data = yaml.safe_load(read_text(path))
    try:
        hw = data["hardware"]
        low, high = (float(r) * 1e9 for r in hw["filesystem_gb_per_s"])
        hardware = Hardware(
            float(hw["hbm_bytes_per_s"]),
            float(hw["memory_bytes"]),
            float(hw["gpu_memory_utilization"]),
            float(hw["efficiency"]),
            int(hw["max_num_seqs"]),
            float(hw["runtime_overhead_gib"]) * GIB,
            float(hw["ep_step_overhead"]),
            (low, high),
            float(hw["warmup_s"]),
        )
        models = {
            str(abbrev): Architecture(
                float(m["kv_bytes_per_token"]),
                float(m["weight_gb"]) * 1e9,
                bool(m.get("kv_replicated", False)),
                float(m.get("expert_weight_gb", 0)) * 1e9,
                float(m.get("draft_weight_gb", 0)) * 1e9,
                {str(k): tuple(float(r) for r in v) for k, v in (m.get("speculative") or {}).items()},
                float((m.get("sliding") or {}).get("kv_bytes_per_token", 0)),
                int((m.get("sliding") or {}).get("window", 0)),
                float(m.get("indexer_bytes_per_token", 0)),
                int(m["attention_topk"]) if "attention_topk" in m else None,
                float(m["runtime_overhead_gib"]) * GIB if "runtime_overhead_gib" in m else None,
                float(m["warmup_s"]) if "warmup_s" in m else None,
            )
            for abbrev, m in data["models"].items()
        }
        return Catalog(hardware, models, float(data["cpu_tokens_per_s"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProcexecError(f"{path}: not an architecture file ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Layout:
    """How a model's GPUs decode: ``dp`` engines of ``tp`` GPUs, ``acceptance`` tokens per sequence and step."""

    tp: int = 1
    dp: int = 1
    ep: bool = False
    max_seqs: int | None = None  # sequences in flight per engine at most (None: the hardware's max_num_seqs)
    draft_steps: int = 0  # drafter passes per step whose weights are read (MTP: num_speculative_tokens)
    acceptance: float = 1.0
    speculative: str = ""  # what the speculative config was read as, for the table

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def shape(self) -> ParallelShape:
        return ParallelShape(self.tp, self.dp, self.ep)

    def describe(self) -> str:
        text = self.shape.describe()
        return f"{text} + {self.speculative}" if self.speculative else text


def parallel_layout(
    model: ModelBase,
    arch: Architecture | None,
    hardware: Hardware,
    measured_acceptance: Mapping[str, float] | None = None,
) -> Layout:
    """The layout ``model`` runs: its ``tensor_parallel_size``; for a server, ``serve_args``' data and expert
    parallel and its ``max_concurrency`` shared by the engines; ``speculative_config`` with the mean acceptance
    length a pilot measured with the same method and depth (``measured_acceptance``: by ``speculative_label``),
    else the acceptance architecture.yaml states for the method (none stated: no gain assumed; a measurement
    of another method or depth is named as not applying)."""
    args = server_args(model)  # data/expert parallel and concurrency: the job's own server
    shape = parallel_shape(model)
    max_seqs = int(args.max_num_seqs or model.engine_kwargs.get("max_num_seqs") or hardware.max_num_seqs)
    if isinstance(model, VllmServerModel):  # the client's requests in flight, shared by the server's engines
        max_seqs = min(max_seqs, max(1, model.max_concurrency // shape.dp))
    layout = Layout(shape.tp, shape.dp, shape.ep, max_seqs)
    spec = model.speculative_config or {}
    k = int(spec.get("num_speculative_tokens") or 0)
    if k <= 0:
        return layout
    method = str(spec.get("method") or "draft_model")
    key = "mtp" if method.endswith("mtp") else method  # vLLM reads deepseek_mtp & co. as mtp
    draft_steps = k if key == "mtp" else 0
    measured = (measured_acceptance or {}).get(speculative_label(spec))
    if measured is not None:
        return replace(
            layout,
            draft_steps=draft_steps,
            acceptance=measured,
            speculative=f"{key.upper()}{k} (a={measured:.2f} measured)",
        )
    elsewhere = sorted(label or "a config not recorded" for label in measured_acceptance or {})
    other = f"; measured with {', '.join(elsewhere)} only: not this method and depth" if elsewhere else ""
    rates = arch.acceptance.get(key) if arch is not None else None
    if not rates:
        return replace(layout, speculative=f"{method} k={k} (acceptance not stated: no gain{other})")
    acceptance = 1.0 + sum(rates[:k])  # positions beyond the stated ones: none accepted
    return replace(
        layout,
        draft_steps=draft_steps,
        acceptance=acceptance,
        speculative=f"{key.upper()}{k} (a={acceptance:.2f}{other})",
    )


def gpu_capacity(arch: Architecture, hardware: Hardware, layout: Layout) -> Capacity:
    """The layout's per-GPU weights and KV pool (procexec.engine.capacity, as check-model computes them): the
    whole MLA latent on each TP rank, a GQA cache split over them, sliding-window layers at most their window;
    an MTP drafter only when speculating; the runtime's own memory (the model's, else the GPU's) deducted."""
    draft_share = arch.draft_bytes / arch.weight_bytes if layout.draft_steps else 0.0
    return capacity(
        layout.shape,
        arch.weight_bytes,
        arch.expert_bytes,
        arch.kv_footprint(layout.tp),
        hardware.memory_bytes,
        hardware.gpu_memory_utilization,
        draft_share,
        runtime_overhead(arch, hardware),
    )


def runtime_overhead(arch: Architecture | None, hardware: Hardware) -> float:
    """Bytes per GPU the runtime keeps beside weights and KV cache: the model's own figure, else the GPU's."""
    own = None if arch is None else arch.runtime_overhead_bytes
    return hardware.runtime_overhead_bytes if own is None else own


def bandwidth_throughput(
    arch: Architecture, hardware: Hardware, layout: Layout, context: float, efficiency: float | None = None
) -> float:
    """Decode tokens/s of all ``layout.gpus`` GPUs at a mean in-flight context of ``context`` tokens.

    Per GPU and step, its weights are read once for its engine's whole batch, and every sequence's KV cache
    once per token it emits: step time = (W_gpu + b x a x KV_gpu(C)) / (efficiency x HBM bandwidth), times
    1 + the expert-parallel overhead under EP, and the ``dp`` engines emit dp x b x a tokens per step.
    W_gpu: the dense part over the engine's TP ranks, the routed experts over all dp x tp GPUs (vLLM's MoE
    layers span the data-parallel group), plus an MTP drafter's share read once per drafted token.
    KV_gpu(C): ``Architecture.kv_read`` (sliding-window layers at most their window, a sparse model's latent
    at most its top-k).  The batch b is what the KV pool holds (the GPU's memory x utilisation, less its
    weights and the runtime's overhead), at most ``max_seqs``.  Speculation (a > 1 tokens per step) thus
    divides the weight reads per token by a but not the KV reads (docs/cluster.md: verifying k + 1 positions of MLA attention is
    compute-bound, about what single tokens cost).
    """
    eff = hardware.efficiency if efficiency is None else efficiency
    ctx = max(context, 1.0)
    room = gpu_capacity(arch, hardware, layout)
    if room.pool_per_gpu <= 0:
        raise ProcexecError(f"weights of {arch.weight_bytes / 1e9:.0f} GB do not fit {layout.describe()}")
    batch = min(float(layout.max_seqs or hardware.max_num_seqs), room.sequences(ctx))
    read = (
        room.weights_per_gpu
        + layout.draft_steps * room.extra_per_gpu
        + batch * layout.acceptance * arch.kv_read(layout.tp, ctx)
    )
    step = read / (eff * hardware.hbm_bytes_per_s) * (1 + (hardware.ep_step_overhead if layout.ep else 0.0))
    return layout.dp * batch * layout.acceptance / step


@dataclass(frozen=True)
class Engine:
    """A configured model as the cost model sees it: its layout and how its rate is known."""

    layout: Layout
    arch: Architecture | None  # None: a CPU model, at the catalog's CPU rate
    basis: str  # "architecture.yaml" | "fallback" (no numbers: checkpoint_gb, the largest KV/token) | "cpu"


def engine_of(model: ModelBase, catalog: Catalog, measured_acceptance: Mapping[str, float] | None = None) -> Engine:
    """A GPU model without architecture numbers gets its ``checkpoint_gb`` as weights and the largest
    KV bytes per token of the catalog (pessimistic: a longer runtime, never a shard cut short by a guess).
    ``measured_acceptance``: a pilot's mean acceptance lengths by what drafted, for a model that speculates."""
    if model.gpus == 0:
        return Engine(Layout(), None, "cpu")
    arch = catalog.models.get(model.abbrev)
    basis = "architecture.yaml"
    if arch is None:
        arch = Architecture(
            max(a.kv_footprint(1).held(1.0) + a.sliding_bytes_per_token for a in catalog.models.values()),
            float(model.checkpoint_gb or 0) * 1e9,
        )
        basis = "fallback"
    return Engine(parallel_layout(model, arch, catalog.hardware, measured_acceptance), arch, basis)


def decode_rate(
    engine: Engine, catalog: Catalog, context: float, efficiency: float | None = None, layout: Layout | None = None
) -> float:
    """Tokens/s of the engine's GPUs at ``context`` (a CPU model: the catalog's CPU rate at any context)."""
    if engine.arch is None:
        return catalog.cpu_tokens_per_s
    return bandwidth_throughput(engine.arch, catalog.hardware, layout or engine.layout, context, efficiency)


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

    @staticmethod
    def merge(works: list[Work]) -> Work:
        tokens = sum(w.tokens for w in works)
        return Work(tokens, sum(w.tokens * w.context for w in works) / tokens if tokens > 0 else 0.0)

    def seconds(
        self, engine: Engine, catalog: Catalog, efficiency: float | None = None, layout: Layout | None = None
    ) -> float:
        return self.tokens / decode_rate(engine, catalog, self.context, efficiency, layout) if self.tokens else 0.0


def stated_work(
    length: int,
    output: OutputModel,
    max_new_tokens: int,
    context_room: int,
    policy: str,
    prompt_tokens: int = PROMPT_TOKENS,
) -> tuple[Work, Work]:
    """(attempt 1, rerun) of one example of ``length`` steps under the stated output model.

    ``context_room`` is what attempt 2 may use in all (max_context - prompt); a rerun happens only when it
    exceeds ``max_new_tokens`` (else it would repeat attempt 1).  ``regenerate`` decodes attempt 1's tokens
    again, ``continue`` does not, ``off`` has no attempt 2.
    """
    p = output.truncation(length)
    short = min(output.mean_tokens(length), max_new_tokens)
    first = Work.of([(1 - p, short, prompt_tokens), (p, max_new_tokens, prompt_tokens)])
    if policy == "off" or context_room <= max_new_tokens:
        return first, Work(0.0, 0.0)
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    if policy == "continue":
        return first, Work.of([(p, extra, prompt_tokens + max_new_tokens)])
    return first, Work.of([(p, max_new_tokens + extra, prompt_tokens)])


def attempt1_budget(model: ModelBase, inference: Inference) -> int:
    """Attempt 1's token budget: the model's own, else inference's (as the job's ``JobSettings``)."""
    return model.max_new_tokens or inference.max_new_tokens


def stated_phases(
    model: ModelBase,
    inference: Inference,
    lengths: list[int],
    prompt_tokens: int = PROMPT_TOKENS,
    output: OutputModel | None = None,
) -> tuple[Work, Work]:
    """(attempt 1, reruns) of one example per length, summed over ``lengths``, each at its mean context
    (``output``: another output model than the model's own, for the interval's token volume)."""
    max_new = attempt1_budget(model, inference)
    room = model.max_context - prompt_tokens
    out = output or output_model(model)
    works = [stated_work(int(L), out, max_new, room, inference.truncation_rerun, prompt_tokens) for L in lengths]
    return Work.merge([w for w, _ in works]), Work.merge([r for _, r in works])


def shard_runtime_minutes(
    model: ModelBase,
    inference: Inference,
    lengths: list[int],
    examples_per_length: int,
    datasets: int,
    shards: int,
    cap: int,
    prompt_tokens: int = PROMPT_TOKENS,
    catalog: Catalog | None = None,
) -> int:
    """SLURM runtime of one inference shard: its share of the stated decode at the bandwidth model's rate.

    The same tokens, contexts, rate and start-up as ``procexec cost`` (attempt 1 and the reruns each at its
    own in-flight context, on the model's layout; ``startup_seconds``), through ``runtime_minutes`` (``cap``:
    the partition's limit; a shard the limit stops resumes on the next run).
    """
    catalog = catalog or load_architecture()
    engine = engine_of(model, catalog)
    first, rerun = stated_phases(model, inference, lengths, prompt_tokens)
    share = examples_per_length * datasets / shards
    decode = share * (first.seconds(engine, catalog) + rerun.seconds(engine, catalog))
    return runtime_minutes(decode, startup_seconds(model, catalog), cap)


def runtime_minutes(decode_seconds: float, startup_s: float, cap: int) -> int:
    """A shard's SLURM runtime for ``decode_seconds`` of decoding after ``startup_s`` of start-up (the stated
    or measured ``startup_seconds``: DS-685's checkpoint alone reads for longer than a fixed allowance):
    1.5 x both, at least 30 minutes and at most ``cap``."""
    return int(min(cap, max(30, round(1.5 * (startup_s + decode_seconds) / 60))))


def startup_seconds(
    model: ModelBase,
    catalog: Catalog,
    measured: float | None = None,
    filesystem_bytes_per_s: float | None = None,
) -> float:
    """One job's start-up before it decodes: ``measured`` (a smoke's load and warm-up) when known, else the
    checkpoint read from the shared filesystem at ``filesystem_bytes_per_s`` (default: the middle of the stated
    range) plus the stated warm-up (architecture.yaml).  A CPU model's start-up is not GPU time: 0."""
    if measured is not None:
        return measured
    if model.gpus == 0:
        return 0.0
    hardware = catalog.hardware
    arch = catalog.models.get(model.abbrev)
    weights = arch.weight_bytes if arch is not None else float(model.checkpoint_gb or 0) * 1e9
    warmup = hardware.warmup_s if arch is None or arch.warmup_s is None else arch.warmup_s
    rate = filesystem_bytes_per_s or sum(hardware.filesystem_bytes_per_s) / 2
    return weights / rate + warmup


@dataclass
class Measured:
    """One model's measured examples: per procedure length, (attempt-1 tokens, rerun tokens) per example."""

    examples: dict[int, list[tuple[int, int]]]
    truncated: int  # attempt-1 generations cut by max_new_tokens
    reruns: int
    looping: int  # generations (any attempt) looping, as status and the score rows count them
    generations: int
    tokens_per_s: float | None  # decode rate of one engine, from the store's commit times
    context: float  # token-weighted mean in-flight context of what was measured
    budgets: frozenset[int] = frozenset()  # attempt 1's requested max_tokens, as its records' sampling says
    # speculative decoding's tokens per step where drafts were counted, by what drafted (speculative_label)
    acceptance_lengths: Mapping[str, float] = field(default_factory=dict)
    startup_s: float | None = None  # seconds per engine start its shards recorded (None: no start recorded)
    #: (tokens, seconds) of each run the rate is measured over (``read_measured``): its spread is the rate's
    rate_runs: tuple[tuple[float, float], ...] = ()
    unrated: int = 0  # generations without a commit time (recovered from a segment): left out of the rate

    @property
    def n(self) -> int:
        return sum(len(v) for v in self.examples.values())


def read_measured(store_dir: Path, prompt_tokens: int = PROMPT_TOKENS, pilot_only: bool = False) -> Measured | None:
    """What a smoke/pilot stored for one model (None when the store is absent or empty).

    Read: the pilot's segments once a pilot ran (its sample of every cell, each example with its reruns,
    decoded in seconds however much the full study has stored since); otherwise every segment.  The smoke's
    generations share the store but not the study's budgets: left out, by segment (``writer_stage``) and by
    ``provenance.stage`` (stores from before the stages had writers of their own).  ``pilot_only``: the
    pilot's segments or nothing (the workflow's DAG build, which must not decode a whole study's store).
    Tokens: a continuation's record counts its attempt's tokens too (``provenance.continued_tokens``),
    which are subtracted.  Rate: per writer (one shard job), its commits split into runs wherever
    ``RUN_GAP_S`` pass without one (a shard resumed hours or days later: the time between its runs is
    no decoding), and per run the tokens committed after its first commit over its first to last
    commit; the runs' sums divided.
    """
    if not store_dir.is_dir():
        return None
    store = Store(store_dir, "procexec-cost-reader")
    if store.load(warn=_refuse_damaged) == 0:
        return None
    per_example: dict[str, dict[int, dict[str, Any]]] = {}
    commits: dict[str, list[tuple[float, int]]] = {}
    pieces: list[tuple[float, float, float]] = []
    looping = generations = unrated = 0
    seen: set[str] = set()
    budgets: set[int] = set()
    segments = study_segments(store_dir)
    pilot = [seg for seg in segments if writer_stage(seg.stem) == "pilot"]
    for seg in pilot if pilot or pilot_only else segments:
        for entry in entries_of(seg):
            if entry.key in seen:
                continue
            seen.add(entry.key)
            record = store.get(entry.key)
            if record is None or (record.get("provenance") or {}).get("stage") == "smoke":
                continue
            generations += 1
            continued = int((record.get("provenance") or {}).get("continued_tokens") or 0)
            new = int(record.get("num_generated_tokens") or 0) - continued
            per_example.setdefault(str(record["id"]), {})[int(record["attempt"])] = {
                "length": int(record["length"]),
                "new": new,
                "finish": record["finish_reason"],
            }
            if entry.committed is None:  # recovered from a segment without its entry: no time to rate it by
                unrated += 1
            else:
                commits.setdefault(entry.writer, []).append((entry.committed, new))
            sampling = (record.get("provenance") or {}).get("sampling") or {}
            if int(record["attempt"]) == 1 and "max_tokens" in sampling:
                budgets.add(int(sampling.get("max_tokens_requested", sampling["max_tokens"])))
            pieces.append((1.0, float(new), float((record.get("prompt_tokens") or prompt_tokens) + continued)))
            if entry.looping is None:  # a record made before records carried their loop verdict: judged now
                looping += ends_looping(
                    detect_loop(record.get("token_ids"), str(record.get("text") or "")), record["finish_reason"]
                )
            else:
                looping += entry.looping
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
    runs = []  # (tokens, seconds) of each run that committed over a span
    for run in (run for items in commits.values() for run in _runs(sorted(items))):
        start, end = run[0][0], run[-1][0]
        if end > start:
            runs.append((float(sum(n for t, n in run if t > start)), end - start))
    tokens, span = sum(n for n, _ in runs), sum(seconds for _, seconds in runs)
    return Measured(
        examples,
        truncated,
        reruns,
        looping,
        generations,
        tokens / span if span > 0 else None,
        Work.of(pieces).context,
        frozenset(budgets),
        measured_acceptance(store_dir),
        measured_startup(store_dir),
        rate_runs=tuple(runs),
        unrated=unrated,
    )


def measured_startup(store_dir: Path) -> float | None:
    """Seconds from launch to ready per engine start, as the model's shards recorded them
    (``procexec.generation.engine_stats``: every stage's, the smoke's too: a start does not depend on the
    budgets); None where no start was recorded."""
    stats = model_stats(store_dir, warn=_refuse_damaged)
    return None if stats is None else stats.per_start(stats.startup_s)


def measured_acceptance(store_dir: Path) -> dict[str, float]:
    """The mean acceptance length of the drafts counted beside a model's store, by what drafted
    (``speculative_label``; "": a file from before it was recorded): its own shards' (a model that speculates)
    and the pilot's speculative half's (``pilot_speculative``: ``speculative-store`` beside it).  An
    acceptance says nothing of another method or depth: ``parallel_layout`` takes the model's own only."""
    drafted: dict[str, EngineStats] = {}
    for folder in (store_dir, store_dir.parent / SPECULATIVE_STORE):
        for _, stats in shard_stats(folder, warn=_refuse_damaged):
            if stats.drafts:
                drafted[stats.speculative] = drafted.get(stats.speculative, EngineStats()) + stats
    return {label: stats.mean_acceptance_length for label, stats in drafted.items() if stats.mean_acceptance_length}


def _runs(commits: list[tuple[float, int]]) -> list[list[tuple[float, int]]]:
    """One writer's (commit time, tokens), in time order, split where ``RUN_GAP_S`` pass without a commit."""
    runs = [commits[:1]]
    for before, item in zip(commits, commits[1:]):
        if item[0] - before[0] > RUN_GAP_S:
            runs.append([])
        runs[-1].append(item)
    return runs


def _refuse_damaged(problem: str) -> None:
    """A measurement is taken from a whole store: data a job would skip and make again is refused here."""
    raise ProcexecError(
        f"{problem}: a measurement needs the store whole (run the stage again to repair it, "
        "or move the damaged files away)"
    )


def measured_tokens(examples: dict[int, list[tuple[int, int]]], lengths: list[int]) -> tuple[list[float], list[float]]:
    """Per configured length, the mean (attempt-1, rerun) tokens of one example.

    Lengths without a measured example are interpolated linearly between measured ones (held
    constant beyond them).
    """
    measured = sorted(examples)
    first = [sum(a for a, _ in examples[L]) / len(examples[L]) for L in measured]
    rerun = [sum(r for _, r in examples[L]) / len(examples[L]) for L in measured]
    return (
        [float(np.interp(L, measured, first)) for L in lengths],
        [float(np.interp(L, measured, rerun)) for L in lengths],
    )


@dataclass
class Projection:
    model: str
    abbrev: str
    gpus: int
    shards: int
    layout: str  # the parallel layout assumed (Layout.describe)
    rate_basis: str  # "architecture.yaml" | "fallback" | "cpu" (Engine.basis)
    basis: str  # "stated" | "measured"
    examples: int  # of the full study
    attempt1_tokens: float
    rerun_tokens: float
    tokens_interval: tuple[float, float]
    context_attempt1: float
    context_rerun: float
    tokens_per_s: float  # the projection's rate, all of the model's GPUs of one shard together
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    layout_gain: float | None  # GPU-hours on plain TP over the same GPUs / on this layout (None: a CPU model)
    paper_gpu_hours: float  # the paper-style layout's (paper_baseline_hours), under the stated token model
    paper_ratio: float  # this config's stated GPU-hours over paper_gpu_hours
    sequences_per_engine: int | None  # of max_context, in one engine's KV pool (gpu_capacity); None: a CPU model
    startup_s: float  # one job's start-up (startup_seconds), once per shard
    startup_gpu_hours: float  # within gpu_hours
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        return self.attempt1_tokens + self.rerun_tokens

    @property
    def wall_hours(self) -> float:
        """With all of the model's shards running at once."""
        return self.gpu_hours / max(self.gpus, 1) / self.shards

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out.update(
            tokens=self.tokens,
            wall_hours=self.wall_hours,
            wall_hours_interval=tuple(h / max(self.gpus, 1) / self.shards for h in self.gpu_hours_interval),
        )
        return out


def project_model(
    config: Config,
    key: str,
    n_datasets: int,
    measured: Measured | None = None,
    catalog: Catalog | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Projection:
    """One model's projection for the full study (``config``'s suite, rerun policy and budgets).

    GPU-hours count every GPU of the model (a CPU model: its one engine): the decode, and one start-up per
    shard.  The interval's low end takes the low token volume (``TOKEN_VOLUME_RANGE``), the high decode
    efficiency and the fast filesystem, its high end the other ends (measured: the bootstrap over the examples and
    the rate's runs, with the start-up's range).  ``layout_gain`` compares the decode of the layout with
    tensor parallel over the same GPUs, no data parallel, no speculation (the stated tokens).
    """
    suite, inference = config.suite, config.inference
    model = config.models[key]
    catalog = catalog or load_architecture()
    engine = engine_of(model, catalog, measured.acceptance_lengths if measured else None)
    gpus, shards = model.gpus, model.shards
    lengths = suite.lengths
    per_length = suite.examples_per_length * n_datasets
    examples = per_length * len(lengths)
    first, rerun = stated_phases(model, inference, lengths)
    per_gpu = max(gpus, 1) / 3600  # engine seconds -> GPU-hours

    def hours(
        efficiency: float | None = None, layout: Layout | None = None, output: OutputModel | None = None
    ) -> float:
        f, r = (first, rerun) if output is None else stated_phases(model, inference, lengths, output=output)
        return (
            per_length
            * (f.seconds(engine, catalog, efficiency, layout) + r.seconds(engine, catalog, efficiency, layout))
            * per_gpu
        )

    measured_start = None if measured is None else measured.startup_s

    def startup_hours(filesystem_bytes_per_s: float | None = None) -> float:
        return startup_seconds(model, catalog, measured_start, filesystem_bytes_per_s) * shards * per_gpu

    slow_fs, fast_fs = catalog.hardware.filesystem_bytes_per_s
    gain = None if engine.arch is None else hours(layout=Layout(tp=max(gpus, 1))) / hours()
    paper = paper_baseline_hours(model, inference, lengths, catalog) * per_length + startup_hours()
    common = dict(
        model=key,
        abbrev=model.abbrev,
        gpus=gpus,
        shards=shards,
        layout=engine.layout.describe() if engine.arch is not None else "CPU",
        rate_basis=engine.basis,
        examples=examples,
        context_attempt1=first.context,
        context_rerun=rerun.context,
        layout_gain=gain,
        paper_gpu_hours=paper,
        paper_ratio=(hours() + startup_hours()) / paper,
        sequences_per_engine=None
        if engine.arch is None
        else gpu_capacity(engine.arch, catalog.hardware, engine.layout).per_engine(model.max_context),
        startup_s=startup_seconds(model, catalog, measured_start),
        startup_gpu_hours=startup_hours(),
    )
    if measured is None or measured.n == 0:
        t1, t2 = first.tokens * per_length, rerun.tokens * per_length
        decode = hours()
        low, high = (varied_output(output_model(model), *ends) for ends in TOKEN_VOLUME_RANGE)
        volume = tuple(
            sum(w.tokens for w in stated_phases(model, inference, lengths, output=out)) * per_length
            for out in (low, high)
        )
        lo_e, hi_e = STATED_EFFICIENCY_RANGE
        if engine.arch is None:  # a CPU model's rate is one figure
            lo_e = hi_e = None
        return Projection(
            **common,
            basis="stated",
            attempt1_tokens=t1,
            rerun_tokens=t2,
            tokens_interval=volume,
            tokens_per_s=(t1 + t2) / (decode / per_gpu),
            gpu_hours=decode + startup_hours(),
            gpu_hours_interval=(
                hours(hi_e, output=low) + startup_hours(fast_fs),
                hours(lo_e, output=high) + startup_hours(slow_fs),
            ),
        )

    # measured: per length means (interpolated), the rate scaled from the measured context to the study's
    m1, m2 = measured_tokens(measured.examples, lengths)
    t1, t2 = sum(m1) * per_length, sum(m2) * per_length
    rate = decode_rate(engine, catalog, first.context)
    if measured.tokens_per_s is not None:
        rate = measured.tokens_per_s * rate / decode_rate(engine, catalog, measured.context)

    def hours_of(tokens: float) -> float:
        return tokens / rate * per_gpu

    rng = np.random.default_rng(seed)
    totals = []
    for _ in range(resamples):
        sample = {L: [v[i] for i in rng.integers(0, len(v), len(v))] for L, v in measured.examples.items()}
        f, r = measured_tokens(sample, lengths)
        totals.append((sum(f) + sum(r)) * per_length)
    lo, hi = (float(q) for q in np.quantile(totals, [0.025, 0.975]))
    decode_lo, decode_hi, rate_interval = hours_of(lo), hours_of(hi), None
    if len(measured.rate_runs) > 1:  # the rate's spread: its runs resampled beside the examples
        runs = np.array(measured.rate_runs)
        picks = np.random.default_rng([seed, 1]).integers(0, len(runs), (resamples, len(runs)))
        rates = runs[picks, 0].sum(axis=1) / runs[picks, 1].sum(axis=1) * (rate / measured.tokens_per_s)
        decode_lo, decode_hi = (float(q) for q in np.quantile(np.array(totals) / rates * per_gpu, [0.025, 0.975]))
        rate_interval = tuple(float(q) for q in np.quantile(rates, [0.025, 0.975]))
    share = {
        "examples": measured.n,
        "generations": measured.generations,
        "truncated_share": measured.truncated / measured.n,
        "rerun_share": measured.reruns / measured.n,
        "loop_share": measured.looping / max(measured.generations, 1),
        "measured_tokens_per_s": measured.tokens_per_s,
        "rate_left_out": measured.unrated,  # generations without a commit time, not in the measured rate
        "tokens_per_s_interval": rate_interval,  # the study's rate over resampled runs (None: one run measured)
        "measured_context": measured.context,
        "measured_startup_s": measured.startup_s,  # per engine start (None: none recorded, the stated one used)
    }
    return Projection(
        **common,
        basis="measured",
        attempt1_tokens=t1,
        rerun_tokens=t2,
        tokens_interval=(lo, hi),
        tokens_per_s=rate,
        gpu_hours=hours_of(t1 + t2) + startup_hours(),
        gpu_hours_interval=(decode_lo + startup_hours(fast_fs), decode_hi + startup_hours(slow_fs)),
        measured=share,
    )


def paper_baseline_hours(model: ModelBase, inference: Inference, lengths: list[int], catalog: Catalog) -> float:
    """Decode GPU-hours of one example per length as the paper ran it: the model's GPUs as one tensor-parallel
    in-process engine (no data or expert parallel, no speculation, the engine's default batch) and every
    truncated generation regenerated from scratch, under the same stated token model and haircuts as the
    projection (``project_model`` adds the same start-ups)."""
    engine = engine_of(model, catalog)
    paper_layout = Layout(tp=max(model.gpus, 1))
    first, rerun = stated_phases(model, inference.model_copy(update={"truncation_rerun": "regenerate"}), lengths)
    seconds = first.seconds(engine, catalog, layout=paper_layout) + rerun.seconds(engine, catalog, layout=paper_layout)
    return seconds * max(model.gpus, 1) / 3600


def project_study(
    config: Config,
    results: str | Path | None = None,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    catalog: Catalog | None = None,
) -> list[Projection]:
    """Every run model's projection but an imported one's (``Config.generated_models``); with ``results``, fitted
    from ``results/generations/<model>/store`` (``read_measured``); ``catalog``: architecture.yaml's, or one with
    other haircuts (``with_haircuts``)."""
    n_datasets = len(expand_suite(config.suite))
    catalog = catalog or load_architecture()
    if results is not None and not Path(results).is_dir():
        raise ProcexecError(f"--measured {results}: not a directory (expected a results folder with generations/)")
    measured = {
        key: None if results is None else read_measured(Path(results) / "generations" / key / "store")
        for key in config.generated_models
    }
    if results is not None and not any(m is not None and m.n for m in measured.values()):
        raise ProcexecError(
            f"--measured {results}: no generations of any run model "
            f"({', '.join(config.generated_models)}) under {Path(results) / 'generations'}/<model>/store: "
            "nothing was measured there (name a smoke or pilot's results folder, or leave out "
            "--measured for the stated projection)"
        )
    for key, m in measured.items():
        budget = attempt1_budget(config.models[key], config.inference)
        if m is not None and m.budgets - {budget}:
            raise ProcexecError(
                f"--measured {results}: {key}'s measured attempt-1 generations were made with max_tokens "
                f"{', '.join(map(str, sorted(m.budgets)))} (their records' sampling), the config gives {budget} "
                f"(models.{key}.max_new_tokens, else inference.max_new_tokens): their token counts and truncations "
                "do not fit this budget; measure a pilot run with this config"
            )
    return [
        project_model(config, key, n_datasets, measured[key], catalog, resamples, seed)
        for key in config.generated_models
    ]


@dataclass(frozen=True)
class BudgetCheck:
    """A projection against its budget: the study's (``cluster.gpu_hours_budget``) or one model's
    (``cluster.model_gpu_hours_budgets``)."""

    scope: str  # "study" or the model's key
    budget: float
    gpu_hours: float
    interval: tuple[float, float]
    over: bool  # the projection's point exceeds the budget
    upper_over: bool  # its interval's upper end does
    line: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def budget_check(scope: str, budget: float, total: float, interval: tuple[float, float], key: str) -> BudgetCheck:
    """Whether a projection (point, upper end) exceeds ``budget`` (config key ``key``), in one line."""
    lo, hi = interval
    over, upper_over = total > budget, hi > budget
    verb = "exceeds" if over else "is within, but its upper end exceeds," if upper_over else "is within"
    what = "" if scope == "study" else f"{scope}: "
    line = f"{what}projected {_hours(total)} GPU-hours ({_hours(lo)}-{_hours(hi)}) {verb} {key} {_hours(budget)}"
    return BudgetCheck(scope, budget, total, interval, over, upper_over, line)


def _hours(value: float) -> str:
    """GPU-hours for a line that compares them: whole hours from 100 on (or when whole), a tenth below (a budget
    of 1.5 must not read as 2 beside a projection of 1.7)."""
    return f"{value:,.0f}" if value >= 100 or float(value).is_integer() else f"{value:,.1f}"


def paper_ratio(rows: list[Projection]) -> float:
    """The study's stated GPU-hours over the paper-style layout's (both under the stated token model)."""
    return sum(r.paper_ratio * r.paper_gpu_hours for r in rows) / sum(r.paper_gpu_hours for r in rows)


def budget_checks(config: Config, rows: list[Projection]) -> list[BudgetCheck]:
    """Each model with a budget against it (``cluster.model_gpu_hours_budgets``), then the study's sum
    against ``cluster.gpu_hours_budget``; empty without budgets."""
    cluster = config.cluster
    per_model = cluster.model_gpu_hours_budgets or {}
    checks = [
        budget_check(
            r.model,
            float(per_model[r.model]),
            r.gpu_hours,
            r.gpu_hours_interval,
            f"cluster.model_gpu_hours_budgets.{r.model}",
        )
        for r in rows
        if r.model in per_model
    ]
    if cluster.gpu_hours_budget is not None:
        interval = (sum(r.gpu_hours_interval[0] for r in rows), sum(r.gpu_hours_interval[1] for r in rows))
        checks.append(
            budget_check(
                "study",
                float(cluster.gpu_hours_budget),
                sum(r.gpu_hours for r in rows),
                interval,
                "cluster.gpu_hours_budget",
            )
        )
    return checks


def haircuts(catalog: Catalog, rows: list[Projection]) -> dict[str, Any]:
    """The stated haircuts a projection took (architecture.yaml, or ``procexec cost``'s overrides), for its rows."""
    hw = catalog.hardware
    own = {r.abbrev: catalog.models[r.abbrev] for r in rows if r.abbrev in catalog.models}
    return {
        "runtime_overhead_gib": hw.runtime_overhead_bytes / GIB,
        "runtime_overhead_gib_by_model": {
            k: a.runtime_overhead_bytes / GIB for k, a in own.items() if a.runtime_overhead_bytes is not None
        },
        "ep_step_overhead": hw.ep_step_overhead,
        "filesystem_gb_per_s": [r / 1e9 for r in hw.filesystem_bytes_per_s],
        "warmup_s": hw.warmup_s,
        "warmup_s_by_model": {k: a.warmup_s for k, a in own.items() if a.warmup_s is not None},
        "job_starts": "one per shard",
        "tokens_factor": [TOKEN_VOLUME_RANGE[0][0], 1.0, TOKEN_VOLUME_RANGE[1][0]],
        "reasoning_truncation_at_95": [TOKEN_VOLUME_RANGE[0][1], REASONING.truncation_at_95, TOKEN_VOLUME_RANGE[1][1]],
        "efficiency": [STATED_EFFICIENCY_RANGE[1], hw.efficiency, STATED_EFFICIENCY_RANGE[0]],
    }


def format_haircuts(cuts: dict[str, Any]) -> list[str]:
    """The ``haircuts`` block under the table: each stated parameter with the point and the interval's ends."""

    def by_model(values: dict[str, float], unit: str) -> str:
        return "".join(f", {k} {v:,.0f}{unit}" for k, v in values.items())

    slow, fast = cuts["filesystem_gb_per_s"]
    tokens, truncation, efficiency = cuts["tokens_factor"], cuts["reasoning_truncation_at_95"], cuts["efficiency"]
    return [
        "haircuts (architecture.yaml; --runtime-overhead-gib, --ep-overhead):",
        f"  runtime memory per GPU out of the KV pool: {cuts['runtime_overhead_gib']:g} GiB"
        + by_model(cuts["runtime_overhead_gib_by_model"], " GiB"),
        f"  expert parallel all-to-all: +{cuts['ep_step_overhead']:.0%} decode step time",
        f"  start-up, {cuts['job_starts']}: checkpoint at {(slow + fast) / 2:g} GB/s ({fast:g}-{slow:g} in the "
        f"interval) + warm-up {cuts['warmup_s']:,.0f} s" + by_model(cuts["warmup_s_by_model"], " s"),
        f"  interval, low-high: tokens per generation x{tokens[0]:g}-x{tokens[2]:g} (point x{tokens[1]:g}), "
        f"reasoning truncation at 95 steps {truncation[0]:.0%}-{truncation[2]:.0%} (point {truncation[1]:.0%}), "
        f"decode efficiency {efficiency[0]:g}-{efficiency[2]:g} (point {efficiency[1]:g}), start-up at "
        f"{fast:g}-{slow:g} GB/s",
    ]


def format_projection(
    rows: list[Projection], budgets: Sequence[BudgetCheck] = (), paper: bool = False, cuts: dict[str, Any] | None = None
) -> str:
    """The table; ``paper``: each model's paper-style GPU-hours and the ratio beside it (``--baseline paper``);
    ``cuts``: the haircuts block (``haircuts``)."""
    width = max((len(r.layout) for r in rows), default=6)
    head = (
        f"{'model':<8} {'GPUs':>4} {'layout':<{width}} {'gain':>5} {'seq/eng':>7} {'basis':<8} {'attempt1':>9} "
        f"{'reruns':>8} "
        f"{'ctx1':>7} {'ctx2':>7} {'tok/s':>7} {'start':>6} {'GPU-h':>8} {'GPU-h interval':>17} {'wall h':>7}"
    )
    lines = [head + (f" {'paper GPU-h':>11} {'ratio':>5}" if paper else "")]
    for r in rows:
        gain = "-" if r.layout_gain is None else f"x{r.layout_gain:.2f}"
        basis = r.basis if r.rate_basis == "architecture.yaml" else f"{r.basis}*"
        seqs = "-" if r.sequences_per_engine is None else f"{r.sequences_per_engine:,}"
        lines.append(
            f"{r.abbrev:<8} {r.gpus:>4} {r.layout:<{width}} {gain:>5} {seqs:>7} {basis:<8} "
            f"{r.attempt1_tokens / 1e9:>8.2f}G {r.rerun_tokens / 1e9:>7.2f}G {r.context_attempt1:>7,.0f} "
            f"{r.context_rerun:>7,.0f} {r.tokens_per_s:>7,.0f} {r.startup_gpu_hours:>6,.0f} {r.gpu_hours:>8,.0f} "
            f"{r.gpu_hours_interval[0]:>8,.0f}-{r.gpu_hours_interval[1]:<8,.0f} {r.wall_hours:>7,.1f}"
            + (f" {r.paper_gpu_hours:>11,.0f} {r.paper_ratio:>5.2f}" if paper else "")
        )
    total = sum(r.gpu_hours for r in rows)
    lo = sum(r.gpu_hours_interval[0] for r in rows)
    hi = sum(r.gpu_hours_interval[1] for r in rows)
    lines.append(
        f"all: {sum(r.attempt1_tokens for r in rows) / 1e9:.2f}G attempt-1 + "
        f"{sum(r.rerun_tokens for r in rows) / 1e9:.2f}G rerun tokens; {total:,.0f} H200 GPU-hours "
        f"({lo:,.0f}-{hi:,.0f}); wall (every model's shards at once, longest model): "
        f"{max((r.wall_hours for r in rows), default=0):,.1f} h"
    )
    lines.append(
        "gain: GPU-hours with tensor parallel over the same GPUs, no data parallel, no speculation, "
        "over those of the layout; seq/eng: sequences of max_context one engine's KV pool holds "
        "(as check-model computes it); start: GPU-hours of the shards' start-ups, within GPU-h"
    )
    if cuts is not None:
        lines.extend(format_haircuts(cuts))
    if paper:
        baseline = sum(r.paper_gpu_hours for r in rows)
        lines.append(
            f"paper: {baseline:,.0f} GPU-hours with every model tensor-parallel in-process and truncated "
            f"generations regenerated, under the same stated token model; ratio {paper_ratio(rows):.2f}"
        )
    starts = [f"{r.abbrev} {r.startup_s:,.0f} s" for r in rows if r.measured.get("measured_startup_s") is not None]
    if starts:
        lines.append(
            f"start-up measured (per engine start, the shards' statistics; in place of the stated one): "
            f"{', '.join(starts)}"
        )
    unrated = [f"{r.abbrev} {r.measured['rate_left_out']:,}" for r in rows if r.measured.get("rate_left_out")]
    if unrated:
        lines.append(
            "rate measured without the generations recovered from a segment past its index (no commit time): "
            + ", ".join(unrated)
        )
    fallback = sorted({f"{r.abbrev} ({r.rate_basis})" for r in rows if r.rate_basis != "architecture.yaml"})
    if fallback:
        lines.append(f"*: rate without architecture numbers: {', '.join(fallback)} (docs/cluster.md)")
    lines.extend(b.line for b in budgets)
    return "\n".join(lines)

"""The decode rate: a bandwidth model of a model's GPUs at the in-flight context, for the parallel layout it
runs (tensor, data and expert parallel; speculative decoding)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from procexec.cluster.cost.catalog import Architecture, Catalog, Hardware
from procexec.config.model import ModelBase, VllmServerModel
from procexec.engine.capacity import Capacity, ParallelShape, capacity, parallel_shape, server_args
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import speculative_label


@dataclass(frozen=True)
class Layout:
    """How a model's GPUs decode: ``dp`` engines of ``tp`` GPUs, ``acceptance`` tokens per sequence and step."""

    tp: int = 1
    dp: int = 1
    ep: bool = False
    max_seqs: int | None = None  # sequences in flight per engine at most (None: the hardware's max_num_seqs)
    draft_steps: int = 0  # drafter passes per step whose weights are read (num_speculative_tokens)
    drafter: str = ""  # the speculative method whose drafter's weights those are ("mtp", "eagle3", ...)
    acceptance: float = 1.0
    loop_acceptance: float | None = None  # tokens per sequence and step in a loop's tail (None: acceptance)
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

    def in_loop(self) -> Layout:
        """This layout decoding a loop's tail (``loop_acceptance`` tokens per step)."""
        return self if self.loop_acceptance is None else replace(self, acceptance=self.loop_acceptance)


#: Speculative methods whose drafter is a network with weights read once per drafted token (n-gram and suffix
#: decoding look tokens up instead).
DRAFTER_METHODS = frozenset({"mtp", "eagle", "eagle3", "draft_model", "medusa", "mlp_speculator"})


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
    of another method or depth is named as not applying).

    n-gram drafting in a loop's tail, until a pilot measures it, is taken to accept every one of its k drafted
    tokens: prompt lookup drafts the k tokens after the earliest earlier occurrence of the context's last
    n-gram (``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``); in
    an exact repetition whose text first appeared in the loop itself those are the loop's next k tokens, which
    greedy verification accepts.  Assumed for every loop: one repeating text that also appears earlier (the
    prompt's procedure, an earlier step) drafts that text's continuation and accepts less.  A pilot's
    speculative half measures one acceptance over all its tokens, tails included, which then replaces both.
    """
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
    draft_steps = k if key in DRAFTER_METHODS else 0
    layout = replace(layout, drafter=key if draft_steps else "")
    measured = (measured_acceptance or {}).get(speculative_label(spec))
    if key == "ngram" and measured is None:
        layout = replace(layout, loop_acceptance=1.0 + k)
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
        loop = "" if layout.loop_acceptance is None else f"; a={layout.loop_acceptance:.0f} in loops"
        return replace(layout, speculative=f"{method} k={k} (acceptance not stated: no gain{loop}{other})")
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
    a drafter only when speculating (an MTP module spread as the checkpoint it is part of, another drafter
    whole on every engine, split over its TP ranks); the runtime's own memory (the model's, else the GPU's)
    deducted."""
    draft_share = 0.0
    if layout.draft_steps and layout.drafter == "mtp":
        draft_share = arch.draft_bytes / arch.weight_bytes
    elif layout.draft_steps:
        weights = (arch.weight_bytes - arch.expert_bytes) / layout.tp + arch.expert_bytes / layout.gpus
        draft_share = arch.draft_bytes / layout.tp / weights
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
    once: step time = (W_gpu + b x KV_gpu(C)) / (efficiency x HBM bandwidth), times
    1 + the expert-parallel overhead under EP, and the ``dp`` engines emit dp x b x a tokens per step.
    W_gpu: the dense part over the engine's TP ranks, the routed experts over all dp x tp GPUs (vLLM's MoE
    layers span the data-parallel group), plus an MTP drafter's share read once per drafted token.
    KV_gpu(C): ``Architecture.kv_read`` (sliding-window layers at most their window, a sparse model's latent
    at most its top-k).  The batch b is what the KV pool holds (the GPU's memory x utilisation, less its
    weights and the runtime's overhead), at most ``max_seqs``.  Speculation (a > 1 tokens per step) divides
    the weight reads per token by a; the KV reads by a too for GQA and sliding-window attention, whose
    verification of k + 1 positions reads each sequence's cache once per step (its query heads share a KV head:
    one pass serves them), but not for MLA, whose verification is compute-bound, about what a + 1 single tokens
    cost (docs/cluster.md): there the KV term is b x a x KV_gpu(C) per step.
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
        + batch * (layout.acceptance if arch.mla else 1.0) * arch.kv_read(layout.tp, ctx)
    )
    step = read / (eff * hardware.hbm_bytes_per_s) * (1 + (hardware.ep_step_overhead if layout.ep else 0.0))
    return layout.dp * batch * layout.acceptance / step


@dataclass(frozen=True)
class Deployment:
    """A configured model as the cost model sees it: its layout over the GPUs (one engine or several), its
    architecture numbers and how its rate is known."""

    layout: Layout
    arch: Architecture | None  # None: a CPU model, at the catalog's CPU rate
    basis: str  # "architecture.yaml" | "fallback" (no numbers: checkpoint_gb, the largest KV/token) | "cpu"


def deployment_of(
    model: ModelBase, catalog: Catalog, measured_acceptance: Mapping[str, float] | None = None
) -> Deployment:
    """A GPU model without architecture numbers gets its ``checkpoint_gb`` as weights and the largest
    KV bytes per token of the catalog (pessimistic: a longer runtime, never a shard cut short by a guess).
    ``measured_acceptance``: a pilot's mean acceptance lengths by what drafted, for a model that speculates."""
    if model.gpus == 0:
        return Deployment(Layout(), None, "cpu")
    arch = catalog.models.get(model.abbrev)
    basis = "architecture.yaml"
    if arch is None:
        arch = Architecture(
            max(a.kv_footprint(1).held(1.0) + a.sliding_bytes_per_token for a in catalog.models.values()),
            float(model.checkpoint_gb or 0) * 1e9,
        )
        basis = "fallback"
    return Deployment(parallel_layout(model, arch, catalog.hardware, measured_acceptance), arch, basis)


def decode_rate(
    deployment: Deployment,
    catalog: Catalog,
    context: float,
    efficiency: float | None = None,
    layout: Layout | None = None,
) -> float:
    """Tokens/s of the deployment's GPUs (all its engines) at ``context`` (a CPU model: the catalog's CPU rate at any context)."""
    if deployment.arch is None:
        return catalog.cpu_tokens_per_s
    return bandwidth_throughput(deployment.arch, catalog.hardware, layout or deployment.layout, context, efficiency)

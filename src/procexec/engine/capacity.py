"""How many sequences a model's GPUs hold under its parallel layout: one answer for ``check-model`` and ``cost``.

A job runs ``dp`` engines of ``tp`` GPUs each on one node (``tensor_parallel_size``; a job server's
``--data-parallel-size`` and ``--enable-expert-parallel`` in ``serve_args``).  Per GPU:

* weights: the dense part (attention, dense and shared-expert layers, embeddings) split over the engine's
  ``tp`` ranks, the routed experts over all ``dp x tp`` GPUs: vLLM flattens the MoE layers' parallelism
  across DP x TP, and with expert parallel each GPU owns 1/(DP x TP) of the experts whole
  (``vllm/model_executor/layers/fused_moe/config.py``, ``FusedMoEParallelConfig.make``);
* KV cache of one sequence (``KvFootprint``): every token in the full-attention layers (and DeepSeek-V3.2's
  indexer key cache), at most the window in sliding-window layers; what the caller knows (vLLM's own
  per-rank figures in check-model; the architecture numbers split over TP, or whole for MLA, in cost);
* KV pool: memory x ``gpu_memory_utilization`` less the weights (and a drafter's share) and the runtime's
  own memory (activations, CUDA graphs, communication buffers: ``reserved``, a stated haircut; vLLM's
  profiling deducts what it measures, ``vllm/v1/worker/gpu_worker.py``, ``available_kv_cache_memory_bytes``).

An engine holds as many sequences as one of its GPUs' pools does (each GPU caches its share of every
sequence); a node holds ``dp`` times that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from procexec.config.model import ModelBase, VllmServerModel
from procexec.config.serve_args import ServeArgs, parse_serve_args


@dataclass(frozen=True)
class ParallelShape:
    """``dp`` engines of ``tp`` GPUs, experts spread over all of them when ``ep``."""

    tp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    def describe(self) -> str:
        return f"TP{self.tp}" + (f" x DP{self.dp}" if self.dp > 1 else "") + (" + EP" if self.ep else "")


def server_args(model: ModelBase) -> ServeArgs:
    """A job server's ``serve_args`` as ``vllm serve`` reads them (procexec.config.serve_args); none for any other
    backend (data parallel is the job server's own)."""
    return parse_serve_args(model.serve_args if isinstance(model, VllmServerModel) else [])


def parallel_shape(model: ModelBase) -> ParallelShape:
    """The layout a configured model runs: its ``tensor_parallel_size``; for a job server, ``serve_args``'
    data parallel, and expert parallel from the flags (argparse: the last wins), else ``engine_kwargs``."""
    args = server_args(model)
    ep = args.enable_expert_parallel
    if ep is None:
        ep = bool(model.engine_kwargs.get("enable_expert_parallel", False))
    return ParallelShape(model.tensor_parallel_size, args.data_parallel_size, ep)


@dataclass(frozen=True)
class KvFootprint:
    """KV bytes one sequence holds on one GPU: ``per_token`` for every token of its context (full-attention
    layers, an indexer's key cache), ``windowed_per_token`` for at most ``window`` of them (sliding-window
    layers: vLLM's hybrid KV cache manager frees the blocks that leave the window,
    ``vllm/v1/core/single_type_kv_cache_manager.py``, ``SlidingWindowManager.remove_skipped_blocks``)."""

    per_token: float
    windowed_per_token: float = 0.0
    window: int = 0

    def held(self, context: float) -> float:
        ctx = max(context, 1.0)
        return self.per_token * ctx + self.windowed_per_token * min(ctx, float(self.window))


@dataclass(frozen=True)
class Capacity:
    """What each GPU of a layout holds, and the sequences that fit (module docstring)."""

    shape: ParallelShape
    weights_per_gpu: float
    extra_per_gpu: float  # a built-in drafter's share, loaded only when speculating
    kv: KvFootprint
    pool_per_gpu: float

    def sequences(self, context: float) -> float:
        """Sequences of ``context`` tokens one engine's KV pool holds (fractional; 0 when weights fill it)."""
        return max(self.pool_per_gpu, 0.0) / self.kv.held(context)

    def per_engine(self, context: float) -> int:
        return math.floor(self.sequences(context))

    def per_node(self, context: float) -> int:
        return self.shape.dp * self.per_engine(context)


def capacity(
    shape: ParallelShape,
    weight_bytes: float,
    expert_bytes: float,
    kv: KvFootprint,
    memory_bytes: float,
    utilization: float,
    extra_share: float = 0.0,
    reserved: float = 0.0,
) -> Capacity:
    """Per-GPU weights and KV pool of ``shape`` (``expert_bytes``: the routed experts within
    ``weight_bytes``; ``extra_share``: a drafter's bytes as a share of the weights, spread as they are;
    ``reserved``: the runtime's own bytes per GPU)."""
    weights = (weight_bytes - expert_bytes) / shape.tp + expert_bytes / shape.gpus
    extra = extra_share * weights
    return Capacity(shape, weights, extra, kv, memory_bytes * utilization - weights - extra - reserved)

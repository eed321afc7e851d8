"""The numbers the cost model reads: the GPU's (``Hardware``: the selected GPU of ``data/hardware.yaml``,
``procexec.config.hardware``, with the runtime's haircuts) and each model's (``Architecture``), from
``data/architecture.yaml``, where each one's source is written beside it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from procexec.config.hardware import DEFAULT_HARDWARE, Gpu, load_catalog, selected_gpu
from procexec.config.model import Config
from procexec.engine.capacity import KvFootprint
from procexec.errors import ProcexecError
from procexec.io.files import read_text

ARCHITECTURE_FILE = Path(__file__).resolve().parents[2] / "data" / "architecture.yaml"
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """One GPU as the bandwidth model sees it: its numbers (``gpu``, hardware.yaml) and the runtime's haircuts."""

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
    gpu: Gpu | None = None  # the GPU the numbers are of (None: stated directly, as tests do)

    def on(self, gpu: Gpu) -> Hardware:
        """These haircuts on ``gpu``: its memory, bandwidth and vLLM's default batch."""
        return replace(
            self,
            hbm_bytes_per_s=float(gpu.hbm_tb_per_s) * 1e12,
            memory_bytes=gpu.memory_bytes,
            max_num_seqs=gpu.max_num_seqs,
            gpu=gpu,
        )


@dataclass(frozen=True)
class Architecture:
    kv_bytes_per_token: float  # layers that hold every token of the context
    weight_bytes: float
    kv_replicated: bool = False  # MLA: every tensor-parallel rank caches the whole latent
    expert_bytes: float = 0.0  # routed experts (within weight_bytes): spread over every GPU under data parallel
    draft_bytes: float = (
        0.0  # its drafter's weights (DeepSeek's MTP module, an EAGLE3 head), loaded only when speculating
    )
    acceptance: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per method: accepted share per position
    sliding_bytes_per_token: float = 0.0  # sliding-window layers, each holding at most sliding_window tokens
    sliding_window: int = 0
    indexer_bytes_per_token: float = 0.0  # DeepSeek-V3.2's indexer key cache: whole on every TP rank
    attention_topk: int | None = None  # sparse attention: latent tokens one decode query reads
    runtime_overhead_bytes: float | None = None  # per GPU; None: the hardware's
    warmup_s: float | None = None  # None: the hardware's
    drafter: dict[str, Any] | None = None  # the speculative_config procexec cost's levers run it with (None: n-gram)

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V3's, Kimi-K2's): the one kind whose KV is replicated."""
        return self.kv_replicated

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

    def on(self, gpu: Gpu) -> Catalog:
        """This catalog on another GPU (``cluster.hardware``)."""
        return replace(self, hardware=self.hardware.on(gpu))


@functools.lru_cache(maxsize=4)
def load_architecture(path: str | Path = ARCHITECTURE_FILE) -> Catalog:
    """The runtime's haircuts and per-abbrev architecture numbers of ``path`` (sources in the file), on the
    catalog's default GPU (H200; ``catalog_for`` puts a config's own under them)."""
    data = yaml.safe_load(read_text(path))
    try:
        hw = data["runtime"]
        low, high = (float(r) * 1e9 for r in hw["filesystem_gb_per_s"])
        hardware = Hardware(
            0.0,
            0.0,
            float(hw["gpu_memory_utilization"]),
            float(hw["efficiency"]),
            0,
            float(hw["runtime_overhead_gib"]) * GIB,
            float(hw["ep_step_overhead"]),
            (low, high),
            float(hw["warmup_s"]),
        ).on(load_catalog()[DEFAULT_HARDWARE])
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
                dict(m["drafter"]) if "drafter" in m else None,
            )
            for abbrev, m in data["models"].items()
        }
        return Catalog(hardware, models, float(data["cpu_tokens_per_s"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProcexecError(f"{path}: not an architecture file ({type(exc).__name__}: {exc})") from None


def catalog_for(config: Config) -> Catalog:
    """architecture.yaml's numbers on the GPU ``config`` selects (``cluster.hardware``)."""
    return load_architecture().on(selected_gpu(config.cluster))

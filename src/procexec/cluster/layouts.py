"""Each model's parallel layout on the selected GPU, derived from its memory: the planner behind ``prepare`` and
``procexec plan``.

A model entry that leaves ``gpus``, ``tensor_parallel_size`` and (for a job server) the data-parallel flags of
``serve_args`` out is planned here for ``cluster.hardware``; one that states any of them is pinned, and held to
the same test.  A layout fits when

* every engine's KV pool holds at least one sequence of ``max_context``: the capacity model ``check-model`` and
  ``cost`` share (``procexec.engine.capacity``, through ``procexec.cluster.cost.throughput.gpu_capacity``:
  weights per GPU with the routed experts over the data-parallel group, the runtime's memory, an MTP drafter
  when speculating).  vLLM itself refuses to start otherwise (``vllm/v1/core/kv_cache_utils.py``,
  ``check_enough_kv_cache_memory``: "To serve at least one request with the models's max seq len ...");
* its GPUs hold at least the recipe's ``vram_minimum_gb`` (``data/layouts.yaml``);
* tensor parallel stays within the GPU's NVLink domain, and a data-parallel rank within one node.

Candidates, in order, the first that fits wins (``data/layouts.yaml`` says which strategy a model's vLLM recipe
uses):

* ``tensor-parallel`` (every model by default): one engine of 1, 2, 4, ... GPUs, up to the NVLink domain;
* ``data-expert-parallel`` (DS-685, KK-1T; a ``vllm-server`` model only): DP ranks of the recipe's TP for the
  GPU generation, expert parallel, over 1, 2, 3, ... whole nodes (``MAX_NODES``).  More than one node: vLLM's own
  multi-node data parallelism (``procexec.engine.multinode``).

On an H200 this gives the layouts the study ran with (tests/cluster/test_layouts.py holds it).  Whether vLLM 0.32 has
the model's kernels for the GPU (``compute_capability``) is reported, and refused when the workflow would run it
(``kernel_refusal``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from procexec.cluster.cost.catalog import Catalog, catalog_for
from procexec.cluster.cost.throughput import deployment_of, gpu_capacity
from procexec.config import invalid, layout_problems, load_merged
from procexec.config.hardware import Gpu, hardware_label, selected_gpu
from procexec.config.model import Config, ModelBase, VllmServerModel
from procexec.config.serve_args import ServeArgsError, parse_serve_args
from procexec.engine.capacity import parallel_shape, server_args
from procexec.errors import ProcexecError
from procexec.io.files import read_text

LAYOUTS_FILE = Path(__file__).resolve().parents[1] / "data" / "layouts.yaml"
STRATEGIES = ("tensor-parallel", "data-expert-parallel")
#: The most nodes one data-parallel job is planned over (a model needing more is refused: it fits no site).
MAX_NODES = 16


@dataclass(frozen=True)
class Recipe:
    """How a model's vLLM recipe lays it out (``data/layouts.yaml``)."""

    strategy: str = "tensor-parallel"
    tensor_parallel: dict[str, int] = field(default_factory=dict)  # data-expert-parallel: TP per DP rank, by major
    vram_minimum_gb: float = 0.0
    compute_capability: tuple[int, ...] = ()  # majors with the model's kernels (empty: every GPU)
    sources: dict[str, str] = field(default_factory=dict)

    def rank_tp(self, gpu: Gpu) -> int:
        return int(self.tensor_parallel.get(str(gpu.major), self.tensor_parallel.get("default", 1)))


@functools.lru_cache(maxsize=2)
def load_recipes(path: str | Path = LAYOUTS_FILE) -> dict[str, Recipe]:
    """Each model's recipe layout by abbrev (sources in the file)."""
    data = yaml.safe_load(read_text(path)) or {}
    try:
        recipes = {
            str(abbrev): Recipe(
                str(entry.get("strategy", "tensor-parallel")),
                {str(k): int(v) for k, v in (entry.get("tensor_parallel") or {}).items()},
                float(entry.get("vram_minimum_gb") or 0),
                tuple(int(m) for m in entry.get("compute_capability") or ()),
                {str(k): " ".join(str(v).split()) for k, v in (entry.get("sources") or {}).items()},
            )
            for abbrev, entry in data.items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise ProcexecError(f"{path}: not a layouts file ({type(exc).__name__}: {exc})") from None
    for abbrev, recipe in recipes.items():
        if recipe.strategy not in STRATEGIES:
            raise ProcexecError(f"{path}: {abbrev}.strategy: {recipe.strategy!r} is not one of {', '.join(STRATEGIES)}")
    return recipes


@dataclass(frozen=True)
class NodeLayout:
    """``dp`` engines of ``tp`` GPUs (experts spread over all of them when ``ep``) on nodes of ``gpus_per_node``."""

    tp: int
    dp: int
    ep: bool
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_node))

    @property
    def dp_local(self) -> int:
        """Engines (data-parallel ranks) per node: vLLM's ``--data-parallel-size-local``."""
        return max(1, self.dp // self.nodes)

    @property
    def gpus_on_node(self) -> int:
        """GPUs each node of the job holds."""
        return min(self.gpus, self.gpus_per_node)

    def describe(self) -> str:
        text = f"TP{self.tp}" + (f" x DP{self.dp}" if self.dp > 1 else "") + (" + EP" if self.ep else "")
        return text + (f" over {self.nodes} nodes" if self.nodes > 1 else "")


def node_layout(model: ModelBase, gpu: Gpu) -> NodeLayout:
    """The layout a resolved model entry states (``procexec.engine.capacity.parallel_shape``) on ``gpu``'s nodes."""
    shape = parallel_shape(model)
    return NodeLayout(shape.tp, shape.dp, shape.ep, gpu.gpus_per_node)


@dataclass(frozen=True)
class Plan:
    """One model's layout on a GPU: planned or pinned, whether it fits, and what its engines hold."""

    model: str
    layout: NodeLayout
    pinned: bool
    fits: bool
    runs: bool  # vLLM 0.32 has the model's kernels for the GPU (Recipe.compute_capability)
    why: str  # one line: what decided the layout, or why it does not fit / run
    basis: str  # architecture.yaml | fallback | cpu (the numbers the capacity came from)
    sequences_at_max: int | None  # per engine, of max_context (None: a CPU model)
    pool_gb_per_gpu: float | None
    weights_gb_per_gpu: float | None

    def to_json(self) -> dict[str, Any]:
        layout = self.layout
        return {
            "model": self.model,
            "layout": layout.describe(),
            "tensor_parallel_size": layout.tp,
            "data_parallel_size": layout.dp,
            "expert_parallel": layout.ep,
            "gpus": layout.gpus,
            "nodes": layout.nodes,
            "gpus_per_node": layout.gpus_on_node,
            "data_parallel_size_local": layout.dp_local,
            "pinned": self.pinned,
            "fits": self.fits,
            "runs": self.runs,
            "why": self.why,
            "basis": self.basis,
            "sequences_at_max_context": self.sequences_at_max,
            "kv_pool_gb_per_gpu": self.pool_gb_per_gpu,
            "weights_gb_per_gpu": self.weights_gb_per_gpu,
        }


def _pinned(model: ModelBase) -> bool:
    """The entry states its layout: ``gpus`` or ``tensor_parallel_size``, or a server's data-parallel size."""
    if model.gpus is not None or model.tensor_parallel_size is not None:
        return True
    if isinstance(model, VllmServerModel):
        try:
            return "data_parallel_size" in parse_serve_args(model.serve_args).given
        except ServeArgsError:
            return True  # refused with its own line by the config check
    return False


def _with_layout(model: ModelBase, tp: int, dp: int, ep: bool) -> ModelBase:
    """``model`` with the layout written into its fields (a server's data/expert flags ahead of its own)."""
    update: dict[str, Any] = {"gpus": tp * dp, "tensor_parallel_size": tp}
    if isinstance(model, VllmServerModel) and dp > 1:
        update["serve_args"] = ["--data-parallel-size", str(dp), *(["--enable-expert-parallel"] if ep else [])]
        update["serve_args"] += list(model.serve_args)
    return model.model_copy(update=update)


def _completed(model: ModelBase) -> ModelBase:
    """A pinned entry's missing half: ``tensor_parallel_size`` 1, ``gpus`` its engines' GPUs."""
    tp = model.tensor_parallel_size if model.tensor_parallel_size is not None else 1
    if model.gpus is not None:
        return model.model_copy(update={"tensor_parallel_size": tp})
    try:
        dp = server_args(model.model_copy(update={"tensor_parallel_size": tp})).data_parallel_size
    except ServeArgsError:
        dp = 1
    return model.model_copy(update={"tensor_parallel_size": tp, "gpus": tp * dp})


def assess(model: ModelBase, catalog: Catalog, gpu: Gpu, pinned: bool, recipe: Recipe | None = None) -> Plan:
    """How a resolved entry's layout fares on ``gpu``: it fits (``fits``), vLLM runs it there (``runs``), and
    what one engine holds."""
    recipe = recipe or load_recipes().get(model.abbrev, Recipe())
    layout = node_layout(model, gpu)
    where = _gpu_words(gpu)
    runs = not recipe.compute_capability or gpu.major in recipe.compute_capability
    kernels = (
        ""
        if runs
        else f"vLLM 0.32 has no kernels for {model.abbrev} on compute capability {gpu.compute_capability} "
        f"(it runs on {', '.join(map(str, recipe.compute_capability))}.x: data/layouts.yaml)"
    )
    if not model.holds_gpus:
        why = f"backend {model.backend_kind}: holds no GPU of this study"
        return Plan(model.key, layout, pinned, True, True, why, "none", None, None, None)
    if model.gpus == 0:
        return Plan(model.key, layout, pinned, True, True, "a CPU model (gpus: 0)", "cpu", None, None, None)
    deployment = deployment_of(model, catalog)
    assert deployment.arch is not None
    room = gpu_capacity(deployment.arch, catalog.hardware, deployment.layout)
    fit = room.per_engine(model.max_context)
    pool, weights = room.pool_per_gpu / 1e9, room.weights_per_gpu / 1e9
    problems = []
    if layout.tp > gpu.nvlink_domain:
        problems.append(f"tensor parallel {layout.tp} spans more than the NVLink domain of {gpu.nvlink_domain} GPUs")
    if layout.nodes > 1 and (layout.gpus % gpu.gpus_per_node or gpu.gpus_per_node % layout.tp):
        problems.append(
            f"{layout.gpus} GPUs over nodes of {gpu.gpus_per_node}: a multi-node job takes whole nodes of whole "
            "data-parallel ranks"
        )
    if layout.nodes > 1 and not isinstance(model, VllmServerModel):
        problems.append(
            f"{layout.gpus} GPUs are more than one node's {gpu.gpus_per_node}: only a job server (backend "
            "vllm-server) spans nodes"
        )
    if fit < 1:
        per_sequence = deployment.arch.kv_footprint(layout.tp).held(model.max_context) / 1e9
        problems.append(
            f"one sequence of max_context {model.max_context:,} needs {per_sequence:.1f} GB of KV per GPU, the pool "
            f"holds {max(pool, 0):.1f} GB (weights {weights:.1f} GB per GPU)"
        )
    if recipe.vram_minimum_gb and layout.gpus * gpu.memory_gb < recipe.vram_minimum_gb:
        problems.append(
            f"{layout.gpus} x {gpu.memory_gb:g} GB is under the recipe's vram_minimum_gb {recipe.vram_minimum_gb:g}"
        )
    if problems:
        why = f"{layout.describe()} does not fit {where}: {'; '.join(problems)}"
    else:
        why = f"{layout.describe()}: {fit} sequence(s) of max_context {model.max_context:,} per engine"
    if kernels:
        why += f"; {kernels}"
    return Plan(model.key, layout, pinned, not problems, runs, why, deployment.basis, fit, pool, weights)


def _gpu_words(gpu: Gpu) -> str:
    return f"{gpu.name} ({gpu.memory_gb:g} GB, {gpu.gpus_per_node} per node)"


def _candidates(model: ModelBase, gpu: Gpu, recipe: Recipe) -> list[tuple[int, int, bool]]:
    """(tp, dp, ep) to try, in the recipe's order of preference (module docstring)."""
    if recipe.strategy == "data-expert-parallel" and isinstance(model, VllmServerModel):
        tp = recipe.rank_tp(gpu)
        return [(tp, nodes * gpu.gpus_per_node // tp, True) for nodes in range(1, MAX_NODES + 1)]
    sizes, tp = [], 1
    while tp <= min(gpu.nvlink_domain, gpu.gpus_per_node):
        sizes.append(tp)
        tp *= 2
    return [(tp, 1, False) for tp in sizes]


def plan_model(model: ModelBase, catalog: Catalog, gpu: Gpu) -> tuple[ModelBase, Plan]:
    """``model`` with its layout resolved for ``gpu`` (pinned: its own, completed), and how it fares."""
    recipe = load_recipes().get(model.abbrev, Recipe())
    if not model.holds_gpus:  # an endpoint or an imported model: its own defaults (0 GPUs)
        return model, assess(model, catalog, gpu, True, recipe)
    if _pinned(model):
        resolved = _completed(model)
        return resolved, assess(resolved, catalog, gpu, True, recipe)
    tried = []
    for tp, dp, ep in _candidates(model, gpu, recipe):
        candidate = _with_layout(model, tp, dp, ep)
        plan = assess(candidate, catalog, gpu, False, recipe)
        if plan.fits:
            source = "the recipe's data + expert parallel" if ep else "one engine"
            return candidate, _planned_why(plan, f"{source}, the fewest GPUs that fit")
        tried.append(plan)
    last = tried[-1]
    return _with_layout(model, last.layout.tp, last.layout.dp, last.layout.ep), _planned_why(
        last, f"no candidate fits; the largest tried is {last.layout.describe()}"
    )


def _planned_why(plan: Plan, how: str) -> Plan:
    return Plan(**{**plan.__dict__, "why": f"{how}: {plan.why}"})


def resolve_layouts(config: Config) -> tuple[Config, dict[str, Plan]]:
    """``config`` with every model's layout resolved for its ``cluster.hardware``, and each model's plan."""
    catalog = catalog_for(config)
    gpu = selected_gpu(config.cluster)
    models, plans = {}, {}
    for key, model in config.models.items():
        try:
            models[key], plans[key] = plan_model(model, catalog, gpu)
        except ServeArgsError:  # refused with its own line by the config check; a layout to check it against
            tp = model.tensor_parallel_size or 1
            models[key] = model.model_copy(update={"tensor_parallel_size": tp, "gpus": model.gpus or tp})
    return config.model_copy(update={"models": models}), plans


def planned(config: Config, source: str = "config", refuse_unfit: bool = True) -> Config:
    """``config`` (``procexec.config.prepare``'s) with every model's layout planned or completed for its
    ``cluster.hardware``, and each model's plan (``Config.plans``): how every command and the workflow read a
    config.  A layout that breaks its own rules, or a run model's that does not fit its GPU, is one line
    (ProcexecError), unless ``refuse_unfit`` is false (``procexec plan`` reports the fit instead)."""
    resolved, plans = resolve_layouts(config)
    problems = layout_problems(resolved)
    if refuse_unfit:  # a model whose layout the checks above refuse is not held to its fit as well
        named = {
            key for key in resolved.models if any(p.startswith((f"models.{key}.", f"models.{key}:")) for p in problems)
        }
        problems += unfit_problems(resolved, plans, named)
    if problems:
        raise invalid(source, problems)
    resolved._plans = plans
    return resolved


def load_planned(paths: Sequence[str | Path]) -> Config:
    """Config files read strictly and merged as Snakemake merges them (``procexec.config.load_merged``), each
    model's layout planned for ``cluster.hardware`` (``planned``): the config every command reads."""
    return planned(load_merged(paths), " + ".join(map(str, paths)))


def unfit_problems(
    config: Config, plans: dict[str, Plan], elsewhere: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """A run model whose layout does not fit its GPU, as the config check's lines (a pinned one names the fields
    to leave out); none for the models in ``elsewhere`` (the config check refuses their layout itself)."""
    return [
        f"models.{key}: {plans[key].why}"
        + (
            f" (a pinned layout: leave gpus, tensor_parallel_size and the data-parallel serve_args out to plan "
            f"it, `procexec plan --config CONFIG --hardware {hardware_label(config.cluster)}`)"
            if plans[key].pinned
            else ""
        )
        for key in config.run_models
        if key in plans and key not in elsewhere and not plans[key].fits and plans[key].basis == "architecture.yaml"
    ]


def kernel_refusal(config: Config, plans: dict[str, Plan], models: list[str]) -> str | None:
    """Why the workflow must not run ``models`` on this GPU: vLLM 0.32 has no kernels for one (one line)."""
    for key in models:
        plan = plans.get(key)
        if plan is not None and not plan.runs:
            return (
                f"models.{key}: {plan.why.split('; ')[-1]}; cluster.hardware {hardware_label(config.cluster)} "
                "cannot run it: leave it out of run_models or run it on another GPU"
            )
    return None

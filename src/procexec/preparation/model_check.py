"""``procexec check-model``: what vLLM derives from a staged model folder, checked on the submit host.

vLLM's own ``EngineArgs(**settings).create_model_config()`` (``vllm/engine/arg_utils.py``) builds
``vllm.config.ModelConfig`` (``vllm/config/model.py``) from the model folder with the GPU job's
engine settings (``vllm_backend.engine_settings(model, "cuda", folder)``).  That reads
``config.json`` (``get_config``), resolves the architecture (the registry inspects the model class
in a subprocess "to avoid initializing CUDA"), the dtype (``_get_and_verify_dtype``), the maximum
length (``_get_and_verify_max_len``) and the quantization.  None of it touches a device: the
platform is found through NVML or the package name (``vllm/platforms/__init__.py``), and
``auto`` dtype picks from ``supported_dtypes``, which is ``[bfloat16, float16, float32]`` on an
H200 (``CudaPlatform``, compute capability >= 8.0), on the CPU build (``CpuPlatform``, x86) and on
a submit host with the CUDA wheel but no GPU (``UnspecifiedPlatform``): the same dtype the GPU job
gets.  vLLM's own ``ParallelConfig`` and ``SpeculativeConfig`` are then built as the GPU job's engine builds
them (``parallel_and_speculative``), so what they refuse (a data parallel rank outside the size, ngram's
``prompt_lookup_min`` above ``prompt_lookup_max``) is refused here; the KV getters read ``tensor_parallel_size``,
``pipeline_parallel_size`` and ``rank`` of the whole model or one GPU (``_parallel``).

Every refusal by vLLM (a ``max_model_len`` above what it derives from ``config.json``, an unknown
architecture, remote code that does not import, a tokenizer that does not load) becomes one
``ProcexecError`` naming the model key and the setting.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from procexec.config.model import ModelBase, VllmServerModel
from procexec.config.serve_args import serve_values
from procexec.engine.arguments import check_engine_args, engine_settings
from procexec.engine.capacity import KvFootprint, ParallelShape, capacity, parallel_shape
from procexec.engine.tokenizer import model_tokenizer
from procexec.errors import ProcexecError

#: What the KV-pool estimate cannot know on the submit host; the node (the smoke's server log: "GPU KV cache
#: size", "Maximum concurrency") answers it.
OFF_NODE = (
    "not checked off the node: the memory CUDA reports there, activations and CUDA graphs, NCCL and "
    'expert-parallel all-to-all buffers (the server log\'s "GPU KV cache size" of the smoke stage says '
    "what is left)"
)
# vLLM's refusal of a max_model_len above what it derives (vllm/config/model.py, _get_and_verify_max_len).
_MAX_LEN_REFUSAL = re.compile(
    r"User-specified max_model_len \((?P<asked>\d+)\) is greater than the derived max_model_len "
    r"\((?P<key>[\w.]+)=(?P<derived>[\d.]+) or model_max_length=(?P<mml>[^ ]+) in model's config.json\)"
)


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """What vLLM derives for one model (``checked`` False: nothing to check locally, see ``note``)."""

    model: str
    backend: str
    checked: bool
    note: str | None = None
    model_dir: str | None = None
    vllm_version: str | None = None
    architectures: list[str] = dataclasses.field(default_factory=list)  # config.json's
    architecture: str | None = None  # the one vLLM resolved
    max_model_len: int | None = None  # what the engine will use
    derived_max_model_len: int | None = None  # the model's own maximum (vLLM's derivation from config.json)
    derived_max_model_len_key: str | None = None
    long_max_model_len_allowed: bool = False  # above the derived maximum, allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN
    dtype: str | None = None
    quantization: str | None = None
    tokenizer_mode: str | None = None  # after vLLM's resolution of 'auto' for some architectures
    tokenizer_class: str | None = None
    # token ids the tokenizer knows (0 .. n-1, len(tokenizer) as infer counts them): a stored id outside them is
    # dropped before it is sent (procexec.generation.resumable); procexec status --verify reads it here
    vocabulary: int | None = None
    trust_remote_code: bool = False
    remote_code_config: bool = False  # config class loaded from the model's own code
    remote_code_tokenizer: bool = False
    sliding_window: int | None = None
    # KV cache, whole model: attention layers x KV heads x head size x (2: K and V; 1 for MLA) x dtype bytes
    kv_cache_dtype: str | None = None
    kv_dtype_bytes: int | None = None
    attention_layers: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    mla: bool = False
    kv_bytes_per_token: int | None = None
    # Per GPU of one engine (tensor_parallel_size GPUs): KV heads split over TP (at least 1 per GPU); the job runs
    # data_parallel_size engines (a job server's serve_args), routed experts over all of their GPUs
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel: bool = False
    gpus: int = 0
    kv_bytes_per_token_per_gpu: int | None = None
    sliding_layers: int = 0  # of attention_layers, each holding at most sliding_window tokens
    indexer_bytes_per_token: int = 0  # DeepSeek-V3.2's indexer key cache, whole on every rank
    runtime_overhead_bytes: float = 0.0  # per GPU, out of the KV pool (architecture.yaml's haircut)
    max_context: int | None = None
    checkpoint_bytes: int | None = None
    checkpoint_source: str | None = None  # "staged files" (the manifest's sizes) or "checkpoint_gb" (config)
    expert_share: float = 0.0  # the routed experts' share of the checkpoint (architecture.yaml's numbers)
    weights_bytes_per_gpu: int | None = None
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    kv_pool_bytes_per_gpu: int | None = None
    sequences_fit: int | None = None  # sequences of max_context tokens one engine's KV pool holds at once
    sequences_per_node: int | None = None  # ... all data_parallel_size engines of the job together
    fit_formula: str | None = None
    off_node: str | None = None  # what the estimate cannot check here

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIT_FORMULA = (
    "sequences per engine = floor((gpu_memory x gpu_memory_utilization - weights_per_gpu - runtime_overhead) / "
    "KV of one sequence of max_context per GPU (full layers and indexer: every token; sliding layers: at most "
    "the window)), weights_per_gpu = checkpoint x (1 - expert_share) / TP "
    "+ checkpoint x expert_share / (TP x DP); per node: x DP (procexec.engine.capacity, as procexec cost)"
)


def _vllm_message(exc: BaseException) -> str:
    """vLLM's refusal as one line of text."""
    message = str(exc)
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic wraps what a config's __post_init__ raises
        try:
            message = errors()[0]["msg"].removeprefix("Value error, ")
        except Exception:  # noqa: BLE001 - keep the plain text
            pass
    return " ".join(message.split())


def _refusal(key: str, exc: BaseException, folder: str) -> ProcexecError:
    """vLLM's error as one line naming the model key and the setting at fault."""
    message = _vllm_message(exc)
    found = _MAX_LEN_REFUSAL.search(message)
    if found:
        derived = int(float(found["derived"]))
        return ProcexecError(
            f"models.{key}.max_model_len: {found['asked']} is above the {derived} that vLLM derives from "
            f"config.json ({found['key']}) in {folder} (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides it, at the "
            "model's risk)"
        )
    lowered = message.lower()
    if "trust_remote_code" in lowered or "remote code" in lowered or isinstance(exc, ImportError):
        setting = "trust_remote_code"
    elif "architecture" in lowered:
        setting = "architectures (config.json)"
    elif "quantiz" in lowered:
        setting = "quantization (config.json or engine_kwargs)"
    elif "dtype" in lowered:
        setting = "dtype"
    elif "tokenizer" in lowered:
        setting = "tokenizer_mode"
    else:
        setting = "engine settings"
    kind = type(exc).__name__
    return ProcexecError(f"models.{key} ({setting}): vLLM refuses the model in {folder}: {kind}: {message[:600]}")


def _parallel(tensor_parallel_size: int) -> SimpleNamespace:
    """What ModelConfig's KV getters read from a ParallelConfig (building one counts devices)."""
    return SimpleNamespace(
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=1, rank=0, decode_context_parallel_size=1
    )


def parallel_and_speculative(model: ModelBase, engine_args: Any, model_config: Any) -> None:
    """Build vLLM's ``ParallelConfig`` and ``SpeculativeConfig`` for ``model`` as its GPU job's engine would, so that
    a setting they refuse is one ``ProcexecError`` line naming where it is set, before a GPU is held.

    ``ParallelConfig`` gets the fields the job's engine settings and a server's ``serve_args`` (parsed as
    ``vllm serve`` parses them) give, the rest are its defaults (EngineArgs' too), and ``is_moe_model`` from the
    model config, as ``EngineArgs.create_engine_config`` passes it.  Unless set, the executor backend is ``mp``,
    what vLLM picks for a world that fits one node: its own pick would compare the world size with the GPUs of
    the host that runs the check (vllm/config/parallel.py, on the CUDA platform only).  The speculative
    configuration is ``EngineArgs.create_speculative_config``'s, vLLM's own.
    """
    from vllm.config import ParallelConfig

    where = f"models.{model.key}"
    given = serve_values(model.serve_args) if isinstance(model, VllmServerModel) else {}
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    chosen = {"tensor_parallel_size": engine_args.tensor_parallel_size}
    chosen |= {name: value for name, value in given.items() if name in fields}
    chosen.setdefault("distributed_executor_backend", "mp")
    source = "serve_args" if fields & given.keys() else "tensor_parallel_size"
    try:
        parallel = ParallelConfig(**chosen, is_moe_model=model_config.is_moe)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - every refusal by vLLM is one line
        raise ProcexecError(
            f"{where}.{source}: vLLM refuses the parallel configuration: {_vllm_message(exc)}"
        ) from None
    try:
        engine_args.create_speculative_config(model_config, parallel)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001
        raise ProcexecError(f"{where}.speculative_config: vLLM refuses it: {_vllm_message(exc)}") from None


def checkpoint_size(model: ModelBase, manifest: dict[str, Any]) -> tuple[int | None, str | None]:
    """Bytes of the staged files (the manifest's), else the config's ``checkpoint_gb``."""
    files = manifest.get("files") or {}
    size = sum(f.get("size", 0) for f in files.values() if isinstance(f, dict))
    if size:
        return int(size), "staged files"
    if model.checkpoint_gb:
        return int(model.checkpoint_gb * 1e9), "checkpoint_gb"
    return None, None


def check_model(
    model: ModelBase,
    model_dir: str | None,
    manifest: dict[str, Any],
    *,
    gpu_memory_bytes: float,
    expert_share: float = 0.0,
    runtime_overhead_bytes: float = 0.0,
) -> ModelCheck:
    """Build vLLM's ``ModelConfig`` for ``model`` (a config entry, defaults filled) from ``model_dir``.

    ``model_dir`` is the staged folder (``prepare.model_location``); the settings are the GPU job's.
    ``gpu_memory_bytes`` and ``expert_share`` (the routed experts' share of the checkpoint) are the
    architecture numbers ``procexec cost`` uses, so both count the same sequences per engine; so is
    ``runtime_overhead_bytes``, the GPU memory per GPU the runtime keeps beside weights and KV cache.
    Raises ``ProcexecError`` (one line, naming ``models.KEY.setting``) where vLLM refuses.
    """
    key = model.key
    if not model.stages_weights:
        return ModelCheck(
            model=key,
            backend=model.backend_kind,
            checked=False,
            note="backend openai: the endpoint holds the weights and its own engine settings; nothing "
            "to check locally (the endpoint is checked when infer starts, the tokenizer by "
            "show-prompt)",
        )
    if model_dir is None or not Path(model_dir).is_dir():
        raise ProcexecError(
            f"models.{key}: check-model needs the staged model folder; pass "
            f"--manifest results/models/{key}/manifest.json (procexec prepare-model writes it)"
        )
    settings = engine_settings(model, "cuda", model_dir)
    check_engine_args(settings, f"models.{key}")
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.torch_utils import (
        get_dtype_size,
        kv_cache_dtype_str_to_dtype,
        resolve_kv_cache_dtype_string,
    )

    try:
        engine_args = EngineArgs(**settings)  # all of them: create_model_config picks ModelConfig's
        config = engine_args.create_model_config()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - every refusal by vLLM is one line
        raise _refusal(key, exc, model_dir) from None
    parallel_and_speculative(model, engine_args, config)
    try:
        tokenizer = model_tokenizer(model.model_copy(update={"tokenizer_mode": config.tokenizer_mode}), model_dir)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001
        raise ProcexecError(
            f"models.{key}.tokenizer_mode: vLLM could not load the tokenizer "
            f"(mode {config.tokenizer_mode}) from {model_dir}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:600]}"
        ) from None

    # The model's own maximum: the same derivation with no max_model_len asked for.
    derived = int(config.get_and_verify_max_len(None))
    derived_key = config.model_arch_config.derived_max_model_len_and_key[1]

    whole, per_gpu = _parallel(1), _parallel(model.tensor_parallel_size)
    kv_dtype_name = resolve_kv_cache_dtype_string(engine_args.kv_cache_dtype, config)
    kv_dtype = kv_cache_dtype_str_to_dtype(kv_dtype_name, config)
    kv_dtype_bytes = get_dtype_size(kv_dtype)
    layers = config.get_num_layers_by_block_type(whole, "attention")
    kv_factor = 1 if config.use_mla else 2  # MLA caches one latent vector per token (head_size_v 0)
    head_size = config.get_head_size()
    kv_heads = config.get_num_kv_heads(whole)
    per_token = layers * kv_heads * head_size * kv_factor * kv_dtype_bytes
    per_token_gpu = layers * config.get_num_kv_heads(per_gpu) * head_size * kv_factor * kv_dtype_bytes
    window = config.get_sliding_window() or 0
    layer_types = getattr(config.hf_text_config, "layer_types", None) or []
    # with a window, the layers layer_types marks sliding; without layer_types, every layer (vLLM's Llama/Mistral)
    sliding = (sum(kind == "sliding_attention" for kind in layer_types) if layer_types else layers) if window else 0
    # DeepSeek-V3.2's indexer: per layer and token a key of index_head_dim fp8 bytes and an fp32 scale per 128
    # (vllm/model_executor/models/deepseek_v2.py, Indexer: DeepseekV32IndexerCache, quant_block_size 128)
    index_dim = int(getattr(config.hf_text_config, "index_head_dim", 0) or 0)
    indexer = layers * (index_dim + index_dim // 128 * 4) if hasattr(config.hf_text_config, "index_topk") else 0
    per_layer = per_token_gpu / layers if layers else 0
    footprint = KvFootprint(per_layer * (layers - sliding) + indexer, per_layer * sliding, window)

    checkpoint, checkpoint_source = checkpoint_size(model, manifest)
    utilization = float(engine_args.gpu_memory_utilization)
    gpu_bytes = int(gpu_memory_bytes)
    shape = parallel_shape(model)
    pool = fit = per_node = weights_gpu = None
    note = None
    if model.gpus == 0:
        note = "gpus: 0 (a CPU model): no GPU estimate"
    elif checkpoint is None:
        note = "no checkpoint size (no manifest files, no checkpoint_gb): no GPU estimate"
    elif per_token_gpu:
        room = capacity(
            shape,
            checkpoint,
            checkpoint * expert_share,
            footprint,
            gpu_bytes,
            utilization,
            reserved=runtime_overhead_bytes,
        )
        pool, weights_gpu = int(room.pool_per_gpu), int(room.weights_per_gpu)
        fit, per_node = room.per_engine(model.max_context), room.per_node(model.max_context)
        if fit == 0:
            note = (
                f"not one sequence of max_context {model.max_context} fits the KV pool of one engine "
                f"({shape.describe()})"
            )
    hf_config_module = type(config.hf_config).__module__
    return ModelCheck(
        model=key,
        backend=model.backend_kind,
        checked=True,
        note=note,
        model_dir=model_dir,
        vllm_version=vllm.__version__,
        architectures=list(config.architectures or []),
        architecture=config.architecture,
        max_model_len=int(config.max_model_len),
        derived_max_model_len=derived,
        derived_max_model_len_key=derived_key,
        long_max_model_len_allowed=int(config.max_model_len) > derived,
        dtype=str(config.dtype).removeprefix("torch."),
        quantization=config.quantization,
        tokenizer_mode=config.tokenizer_mode,
        tokenizer_class=type(tokenizer).__name__,
        vocabulary=len(tokenizer),
        trust_remote_code=bool(config.trust_remote_code),
        remote_code_config=hf_config_module.startswith("transformers_modules"),
        remote_code_tokenizer=type(tokenizer).__module__.startswith("transformers_modules"),
        sliding_window=config.get_sliding_window(),
        kv_cache_dtype=kv_dtype_name if kv_dtype_name != "auto" else f"auto ({str(kv_dtype).removeprefix('torch.')})",
        kv_dtype_bytes=kv_dtype_bytes,
        attention_layers=layers,
        kv_heads=kv_heads,
        head_size=head_size,
        mla=bool(config.use_mla),
        kv_bytes_per_token=per_token,
        tensor_parallel_size=shape.tp,
        data_parallel_size=shape.dp,
        expert_parallel=shape.ep,
        gpus=model.gpus,
        kv_bytes_per_token_per_gpu=per_token_gpu,
        sliding_layers=sliding,
        indexer_bytes_per_token=indexer,
        runtime_overhead_bytes=runtime_overhead_bytes,
        max_context=model.max_context,
        checkpoint_bytes=checkpoint,
        checkpoint_source=checkpoint_source,
        expert_share=expert_share,
        weights_bytes_per_gpu=weights_gpu,
        gpu_memory_bytes=gpu_bytes,
        gpu_memory_utilization=utilization,
        kv_pool_bytes_per_gpu=pool,
        sequences_fit=fit,
        sequences_per_node=per_node,
        fit_formula=FIT_FORMULA,
        off_node=OFF_NODE if fit is not None else None,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def format_check(check: ModelCheck) -> str:
    """The check as a few lines of text (``--json`` prints ``to_json`` instead)."""
    if not check.checked:
        return f"model {check.model}: {check.note}"
    remote = (
        ", ".join(
            part
            for part, used in (("config", check.remote_code_config), ("tokenizer", check.remote_code_tokenizer))
            if used
        )
        or "none"
    )
    lines = [
        f"model {check.model}: vLLM {check.vllm_version} accepts {check.model_dir}",
        f"architecture: {check.architecture} (config.json: {', '.join(check.architectures)})",
        f"max_model_len: {check.max_model_len} (the model's own maximum: {check.derived_max_model_len}, "
        f"from config.json {check.derived_max_model_len_key})"
        + ("  ABOVE it: allowed only by VLLM_ALLOW_LONG_MAX_MODEL_LEN" if check.long_max_model_len_allowed else ""),
        f"dtype: {check.dtype}   quantization: {check.quantization or 'none'}   "
        f"sliding window: {check.sliding_window or 'none'}",
        f"tokenizer_mode: {check.tokenizer_mode} ({check.tokenizer_class}, {check.vocabulary:,} token ids)   "
        "trust_remote_code: "
        f"{'yes' if check.trust_remote_code else 'no'}   remote code loaded: {remote}",
        f"KV cache: {check.kv_bytes_per_token:,} bytes/token = {check.attention_layers} attention layers x "
        f"{check.kv_heads} KV heads x head size {check.head_size} x {1 if check.mla else 2}"
        f"{' (MLA latent)' if check.mla else ' (K and V)'} x {check.kv_dtype_bytes} bytes ({check.kv_cache_dtype})",
    ]
    if (  # set together by check_model
        check.sequences_fit is not None
        and check.kv_pool_bytes_per_gpu is not None
        and check.gpu_memory_bytes is not None
        and check.weights_bytes_per_gpu is not None
        and check.checkpoint_bytes is not None
    ):
        layout = ParallelShape(check.tensor_parallel_size, check.data_parallel_size, check.expert_parallel).describe()
        lines.append(
            f"{layout} on {check.gpus} GPU(s): {check.sequences_fit} sequences of max_context {check.max_context} "
            f"per engine, {check.sequences_per_node} per node ({check.kv_bytes_per_token_per_gpu:,} KV bytes/token "
            f"per GPU, {check.sliding_layers} of the layers sliding over {check.sliding_window or 0} tokens, indexer "
            f"{check.indexer_bytes_per_token:,} bytes/token; KV pool {_gib(check.kv_pool_bytes_per_gpu)} per GPU = "
            f"{_gib(check.gpu_memory_bytes)} x {check.gpu_memory_utilization} - weights "
            f"{check.weights_bytes_per_gpu / 1e9:.1f} GB per GPU of checkpoint {check.checkpoint_bytes / 1e9:.1f} GB "
            f"({check.checkpoint_source}), routed experts {check.expert_share:.1%} of it - runtime overhead "
            f"{_gib(int(check.runtime_overhead_bytes))})"
        )
        lines.append(f"  {check.fit_formula}")
        lines.append(f"  {check.off_node}")
    if check.note:
        lines.append(check.note)
    return "\n".join(lines)

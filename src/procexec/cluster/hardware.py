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

import yaml
from pydantic import ValidationError

from procexec.config.model import Cluster, Gpu
from procexec.errors import ProcexecError, validation_problems
from procexec.io.files import read_text

HARDWARE_FILE = Path(__file__).resolve().parents[1] / "data" / "hardware.yaml"
DEFAULT_HARDWARE = "h200"


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


def hardware_problems(cluster: Cluster) -> list[str]:
    """``cluster.hardware`` names a catalog GPU (a stated one is checked by its type)."""
    if isinstance(cluster.hardware, str) and cluster.hardware not in load_catalog():
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
    if isinstance(cluster.hardware, Gpu):
        return cluster.hardware
    return gpu_named(cluster.hardware)


def hardware_label(cluster: Cluster) -> str:
    """How flags and messages name the selected GPU: its catalog name, or the stated GPU's name."""
    return cluster.hardware if isinstance(cluster.hardware, str) else cluster.hardware.name


def hardware_title(cluster: Cluster) -> str:
    """How tables name it: ``H200 GPU-hours`` (a catalog name in capitals), or the stated GPU's name."""
    return cluster.hardware.upper() if isinstance(cluster.hardware, str) else cluster.hardware.name


def gres_type(cluster: Cluster) -> str | None:
    """The GRES type of ``--gpus=TYPE:N``: ``cluster.gpu_type`` where the config sets it (null: none), else the
    selected GPU's."""
    if "gpu_type" in cluster.model_fields_set:
        return cluster.gpu_type
    return selected_gpu(cluster).gres_type

"""All figures of a study: built, drawn in a process pool, written with their manifest as one file set."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from procexec.analysis.figures.inputs import load_inputs
from procexec.analysis.figures.plots import render
from procexec.analysis.figures.specs import figure_specs
from procexec.config.model import Config
from procexec.io.files import FileSet
from procexec.io.jsonl import dumps

DPI = 90


def write_figures(
    config: Config,
    aggregate_dir: str | Path,
    out_dir: str | Path,
    workers: int | None = None,
    dpi: int = DPI,
    only: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Build every figure, draw them in a process pool, write ``manifest.json``; returns the manifest."""
    inputs = load_inputs(config, aggregate_dir)
    manifest, tasks = [], []
    with FileSet(out_dir) as files:
        for spec in figure_specs(inputs.models):
            if only is not None and spec.id not in only:
                continue
            figure: dict[str, Any] = {
                "id": spec.id,
                "number": spec.number,
                "section": spec.section,
                "title": spec.title,
                "caption": spec.caption,
                "model": spec.model,
                "files": None,
            }
            data, opts = spec.build(inputs)
            if data.empty:
                figure["missing"] = "no data"
            else:
                figure["files"] = [f"{spec.id}.{ext}" for ext in ("png", "svg")]
                paths = {ext: str(files.path(f"{spec.id}.{ext}")) for ext in ("png", "svg")}
                tasks.append((spec.kind, spec.title, data, opts, paths, dpi))
            manifest.append(figure)
        workers = workers or min(len(os.sched_getaffinity(0)), 8)
        if workers <= 1:
            for task in tasks:
                render(task)
        else:
            # forkserver: workers never inherit the parent's pyarrow/BLAS threads (fork-safety).
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["procexec.analysis.figures.plots"])
            pool = ProcessPoolExecutor(workers, mp_context=context)
            try:
                list(pool.map(render, tasks, chunksize=4))
            finally:  # an error or an interrupt: queued figures are not drawn
                pool.shutdown(wait=True, cancel_futures=True)
        with files.open("manifest.json") as handle:
            handle.write(dumps({"figures": manifest}) + "\n")
    return manifest

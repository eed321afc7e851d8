"""Generated tokens/s of the in-process backend: procexec's step loop against plain ``LLM.generate``.

Usage::

    python benchmarks/bench_inference.py [--work-dir /tmp/procexec-bench] [--models tiny smollm2] [--repeats 3]

Per model, one engine is started and three modes run on the same prompts:

* ``generate-all``: plain ``LLM.generate`` on every prompt (vLLM's own loop; the baseline),
* ``stream-all``: procexec's path (``VLLMBackend.generate``: every prompt queued
  at once, ``llm_engine.step()`` driven here, each completion handed over as it
  finishes), with each record built (detokenised offsets) and committed to a
  store by its writer thread, as a job does,
* ``stream-per-dataset``: the same, one submission per dataset.

Prefix caching is switched off so a later mode does not reuse an earlier mode's
prompts; after one warm-up round of every mode, the modes alternate over
``--repeats`` rounds and each mode's median round is reported (single rounds on
a shared 2-core machine vary by +-10%).  Target (issue 12): stream-all /
generate-all >= 0.98.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from procexec.benchmark.prompts import chat_messages
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.config import prepare
from procexec.engine.arguments import prepare_device
from procexec.generation.backend import BackendSpec, Request, Sampling
from procexec.generation.backends.vllm import VLLMBackend
from procexec.generation.store import Store
from procexec.preparation.prepare import prepare_model

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ["add_int_1-10_k1", "mul_float_0-1_k1", "mixed_int_10-100_k3", "sub_float_1-10_k1"]
SETTINGS = {
    # model key -> (lengths, examples per length, max new tokens)
    "tiny": ((5, 15), 8, 256),
    "smollm2": ((5,), 2, 64),
}
TINY = {
    "abbrev": "TINY",
    "hf_id": "procexec/tiny-llama",
    "revision": "seed-0",
    "source": "tiny-llama",
    "gpus": 0,
    "shards": 1,
    "tensor_parallel_size": 1,
    "max_model_len": 2048,
    "max_context": 2048,
}


def bench_model(name: str, work: Path, repeats: int) -> dict[str, float]:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["tiny"] = TINY
    config = prepare(raw)
    key = "tiny" if name == "tiny" else "smollm2-135m-instruct"
    model = config.models[key].model_copy(update={"engine_kwargs": {"enable_prefix_caching": False}})
    lengths, per_length, max_tokens = SETTINGS[name]
    manifest_path = work / "models" / key / "manifest.json"
    if not manifest_path.exists():
        prepare_model(model, manifest_path)
    manifest = json.loads(manifest_path.read_text())
    import datetime as dt

    backend = VLLMBackend(BackendSpec(model, str(manifest_path.parent / "hf"), manifest, dt.date(2026, 1, 1)))
    backend.open()
    examples = [e for d in DATASETS for e in generate_dataset(DatasetSpec.from_id(d), lengths, per_length, seed=1)]
    prompts = [backend.render(lambda s, e=e: chat_messages(e, s)) for e in examples]
    sampling = Sampling(0.0, 1.0)
    started = time.monotonic()
    llm = backend._engine()
    results = {"prompts": len(prompts), "max_tokens": max_tokens, "engine_load_s": round(time.monotonic() - started, 1)}

    def generate_all() -> int:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=0)
        outs = llm.generate([{"prompt_token_ids": p.token_ids} for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def stream(groups: list[list[int]]) -> int:
        store = Store(Path(tempfile.mkdtemp(dir=work)), "bench")
        requests = {i: Request(i, prompts[i], max_tokens) for group in groups for i in group}
        count = 0

        def done(c) -> None:
            nonlocal count
            count += c.num_generated_tokens

            def build() -> dict:  # on the store's writer thread, as the job runs a backend's finish_off_loop
                backend.finish(requests[c.tag], c)
                return {
                    "text": c.text,
                    "num_generated_tokens": c.num_generated_tokens,
                    "finish_reason": c.finish_reason,
                    "token_ids": c.token_ids,
                    "token_offsets": c.token_offsets,
                }

            store.put(f"{c.tag:064x}", build)

        for group in groups:
            backend.generate([requests[i] for i in group], sampling, done)
        store.close()
        return count

    modes = {
        "generate-all": generate_all,
        "stream-all": lambda: stream([list(range(len(prompts)))]),
        "stream-per-dataset": lambda: stream([[i for i, e in enumerate(examples) if e.dataset == d] for d in DATASETS]),
    }
    for runner in modes.values():  # warm-up (first batches allocate, the store's first files)
        runner()
    rates: dict[str, list[float]] = {label: [] for label in modes}
    for round_ in range(repeats):
        for label, runner in modes.items():
            t0 = time.monotonic()
            tokens = runner()
            rates[label].append(tokens / (time.monotonic() - t0))
            print(
                f"  {name:8s} round {round_ + 1} {label:20s} {tokens:6d} tokens = {rates[label][-1]:8.1f} tok/s",
                file=sys.stderr,
            )
    median = {label: statistics.median(values) for label, values in rates.items()}
    for label, rate in median.items():
        results[f"{label}_tok_s"] = round(rate, 1)
    results["all_vs_per_dataset"] = round(median["stream-all"] / median["stream-per-dataset"], 3)
    results["stream_vs_generate"] = round(median["stream-all"] / median["generate-all"], 3)
    print(
        f"  {name}: one submission / per-dataset = {results['all_vs_per_dataset']}x; "
        f"step loop + store / LLM.generate = {results['stream_vs_generate']}x",
        file=sys.stderr,
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "procexec-bench"))
    parser.add_argument("--models", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS, reverse=True))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    prepare_device()
    figures = {name: bench_model(name, work, args.repeats) for name in args.models}
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

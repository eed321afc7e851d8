"""Generated tokens/s of the inference backend: one submission for all prompts vs one per dataset.

Usage::

    python benchmarks/bench_inference.py [--work-dir /tmp/procexec-bench] [--models tiny smollm2]

Per model, one engine is started and three modes run on the same prompts:

* ``generate-all``: plain ``LLM.generate`` on every prompt (vLLM's own loop; the baseline),
* ``stream-all``: procexec's path, every prompt queued at once and each completion
  persisted (fsync) to a store as it finishes,
* ``stream-per-dataset``: procexec's path with one engine call per dataset.

Prefix caching is switched off so a later mode does not reuse an earlier
mode's prompts; the numbers then compare scheduling alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from procexec.config import prepare
from procexec.inference import engine as engine_module
from procexec.inference.prepare import prepare_model
from procexec.inference.run import Job
from procexec.inference.store import Store
from procexec.suite import DatasetSpec, generate_dataset

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ["add_int_1-10_k1", "mul_float_0-1_k1", "mixed_int_10-100_k3", "sub_float_1-10_k1"]
SETTINGS = {
    # model key -> (lengths, examples per length, max new tokens)
    "tiny": ((5, 15), 4, 128),
    "smollm2": ((5,), 2, 64),
}
TINY = {
    "abbrev": "TINY", "hf_id": "procexec/tiny-llama", "revision": "seed-0", "source": "tiny-llama",
    "gpus": 0, "shards": 1, "tensor_parallel_size": 1, "max_model_len": 2048, "max_context": 2048,
}


def bench_model(name: str, work: Path) -> dict[str, float]:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["tiny"] = TINY
    config = prepare(raw)
    key = "tiny" if name == "tiny" else "smollm2-135m-instruct"
    model = config["models"][key]
    model["engine_kwargs"] = {"enable_prefix_caching": False}
    lengths, per_length, max_tokens = SETTINGS[name]
    model["max_new_tokens"] = max_tokens
    manifest = work / "models" / key / "manifest.json"
    if not manifest.exists():
        prepare_model(model, manifest)
    examples = [e for d in DATASETS for e in generate_dataset(DatasetSpec.from_id(d), lengths, per_length, seed=1)]
    job = Job(config, key, examples, work / "unused-store", "bench", manifest, progress=False)
    plans = job.plan_first()
    started = time.monotonic()
    engine = engine_module.Engine(job.settings)
    load_s = time.monotonic() - started
    results = {"prompts": len(plans), "max_tokens": max_tokens, "engine_load_s": round(load_s, 1)}

    def timed(label: str, runner) -> None:
        t0 = time.monotonic()
        tokens = runner()
        seconds = time.monotonic() - t0
        results[f"{label}_tok_s"] = round(tokens / seconds, 1)
        results[f"{label}_s"] = round(seconds, 2)
        print(f"  {name:8s} {label:20s} {tokens:6d} tokens in {seconds:7.2f} s = {tokens / seconds:8.1f} tok/s", file=sys.stderr)

    def generate_all() -> int:
        params = engine.sampling(max_tokens, 0.0, 1.0)
        outs = engine.llm.generate([{"prompt_token_ids": p.prompt.token_ids} for p in plans], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def stream(groups: list[list]) -> int:
        store = Store(Path(tempfile.mkdtemp(dir=work)), "bench")
        count = 0

        def done(c: engine_module.Completion) -> None:
            nonlocal count
            count += len(c.token_ids)
            store.put(c.tag.key, {"text": c.text, "token_ids": c.token_ids})

        for group in groups:
            engine.run([engine_module.Request(p, p.prompt.token_ids, max_tokens) for p in group], 0.0, 1.0, done)
        store.close()
        return count

    generate_all()  # warm-up (first batches allocate)
    timed("generate-all", generate_all)
    timed("stream-all", lambda: stream([plans]))
    timed("stream-per-dataset", lambda: stream([[p for p in plans if p.example.dataset == d] for d in DATASETS]))
    results["all_vs_per_dataset"] = round(results["stream-all_tok_s"] / results["stream-per-dataset_tok_s"], 2)
    results["stream_vs_generate"] = round(results["stream-all_tok_s"] / results["generate-all_tok_s"], 2)
    print(f"  {name}: one submission / per-dataset = {results['all_vs_per_dataset']}x; "
          f"step loop + fsync store / LLM.generate = {results['stream_vs_generate']}x", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "procexec-bench"))
    parser.add_argument("--models", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS, reverse=True))
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    engine_module.select_device()
    figures = {name: bench_model(name, work) for name in args.models}
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Speculative decoding by prompt lookup (vLLM's ``ngram`` drafter), measured for identity and speed.

Usage::

    python benchmarks/bench_speculative.py [--work-dir /tmp/procexec-spec] [--models smollm2 tiny]
        [--prompts 8] [--max-new-tokens 128] [--k 4] [--lookup 2 4] [--out figures.json]

Per model, the same prompts (procexec's rendered ids of the demo's datasets) run greedy through
two engines built from the job's engine arguments (``procexec.engine.arguments.engine_settings``,
prefix caching off): plain, and with ``speculative_config={method: ngram,
num_speculative_tokens: K, prompt_lookup_min/max}``.  The outputs are arithmetic traces that
repeat the procedure's own text, the case prompt lookup is made for.  Printed per model:
acceptance rate (accepted / drafted tokens), mean acceptance length (1 + accepted / drafts:
tokens per verifying step), decode tokens/s with / without, the share of generations whose
token ids equal plain greedy, and for those that differ the first differing position.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench_inference import TINY  # the test suite's tiny Llama, with room for longer traces
from procexec.benchmark.prompts import chat_messages
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.config import prepare
from procexec.config.model import ModelBase
from procexec.config.speculative import PILOT_NGRAM
from procexec.engine.arguments import engine_settings, prepare_device
from procexec.generation.backend import BackendSpec
from procexec.generation.backends.vllm import VLLMBackend, counters_since
from procexec.generation.engine_stats import EngineStats
from procexec.generation.speculative import speculative_figures
from procexec.preparation.prepare import prepare_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"smollm2": "smollm2-135m-instruct", "tiny": "tiny"}
DATASETS = ["add_int_1-10_k1", "mixed_float_1-10_k1", "mixed_int_10-100_k3"]


def prompts_of(model: ModelBase, model_dir: Path, manifest: dict[str, Any], count: int) -> list[list[int]]:
    """``count`` prompts over the demo's datasets and lengths, rendered as a job renders them."""
    backend = VLLMBackend(BackendSpec(model, str(model_dir), manifest, dt.date(2026, 1, 1)))
    backend.open()
    examples = [e for d in DATASETS for e in generate_dataset(DatasetSpec.from_id(d), (5, 15, 25), 1, seed=1)]
    return [backend.render(functools.partial(chat_messages, e)).token_ids for e in examples[:count]]


def run(settings: dict[str, Any], prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], EngineStats]:
    """Greedy outputs of one engine, and its decoded tokens, decode seconds (after a warm-up request) and
    speculative counters."""
    import vllm

    llm = vllm.LLM(**settings, disable_log_stats=False)
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0)
    llm.generate([{"prompt_token_ids": prompts[0]}], vllm.SamplingParams(max_tokens=4), use_tqdm=False)
    before = counters_since(llm, EngineStats())
    started = time.monotonic()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    seconds = time.monotonic() - started
    stats = counters_since(llm, before)
    del llm
    ids = [list(o.outputs[0].token_ids) for o in outs]
    stats.decoded_tokens, stats.generate_s = sum(map(len, ids)), seconds
    return ids, stats


def bench_model(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["tiny"] = TINY
    model = prepare(raw).models[MODELS[name]]
    manifest_path = work / "models" / name / "manifest.json"
    if not manifest_path.exists():
        prepare_model(model, manifest_path)
    model_dir = manifest_path.parent / "hf"
    prompts = prompts_of(model, model_dir, json.loads(manifest_path.read_text()), args.prompts)
    settings = {**engine_settings(model, "cpu", str(model_dir)), "enable_prefix_caching": False}
    plain, plain_run = run(settings, prompts, args.max_new_tokens)
    lookup_min, lookup_max = args.lookup
    spec = {
        **PILOT_NGRAM,
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": lookup_min,
        "prompt_lookup_max": lookup_max,
    }
    drafted, drafted_run = run({**settings, "speculative_config": spec}, prompts, args.max_new_tokens)
    figures = {
        "max_new_tokens": args.max_new_tokens,
        "speculative_config": spec,
        **speculative_figures(plain, drafted, plain_run, drafted_run),  # the pilot report's figures too
    }
    print(
        f"{name}: acceptance {figures['acceptance_rate']}, mean acceptance length "
        f"{figures['mean_acceptance_length']}, {figures['plain_tok_s']} -> {figures['speculative_tok_s']} tok/s "
        f"(x{figures['speed_ratio']}), token ids identical {figures['identical']} of {figures['generations']}; "
        f"first differences at {figures['first_difference_at']}",
        file=sys.stderr,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "procexec-spec"))
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["smollm2", "tiny"])
    parser.add_argument("--prompts", type=int, default=8, help="at most 9; default: %(default)s")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--k",
        type=int,
        default=PILOT_NGRAM["num_speculative_tokens"],
        help="num_speculative_tokens; default: %(default)s",
    )
    parser.add_argument(
        "--lookup",
        type=int,
        nargs=2,
        default=[PILOT_NGRAM["prompt_lookup_min"], PILOT_NGRAM["prompt_lookup_max"]],
        metavar=("MIN", "MAX"),
        help="prompt_lookup_min and _max; default: %(default)s",
    )
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    prepare_device()
    figures = {name: bench_model(name, work, args) for name in args.models}
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The study's GPU-hour account: decoded tokens and projected H200 GPU-hours, regenerate vs continue.

For every run model of config.yaml (the paper's 15): the expected decode of the
full suite (55 datasets x 10 lengths x 100 examples) under the stated output
model of ``procexec.cluster.cost`` (mean output length and truncation share per
procedure length, extra tokens a truncated generation needs), once with the
truncation rerun regenerating attempt 1 and once continuing it, converted to
GPU-hours with the model's ``throughput_tok_s`` (sustained decode of one engine
on its GPUs, config.yaml; sources in docs/cluster.md) and its GPU count.

    python benchmarks/gpu_hours.py [--config config.yaml] [--json]

Nothing is run on a GPU: this is arithmetic on stated assumptions, the number
the README gives for "what the full reproduction costs".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from procexec.cluster.cost import expected_decode, output_model
from procexec.config import expand_suite, load

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 700  # the Appendix B prompt plus a 95-step procedure is ~600-1,000 tokens


def account(config: dict) -> list[dict]:
    suite, inference = config["suite"], config["inference"]
    n_datasets = len(expand_suite(suite))
    rows = []
    for key in config["run_models"]:
        model = config["models"][key]
        max_new = int(model.get("max_new_tokens", inference["max_new_tokens"]))
        room = int(model["max_context"]) - PROMPT_TOKENS
        out = output_model(model)
        row = {"model": key, "abbrev": model["abbrev"], "gpus": model["gpus"],
               "throughput_tok_s": model["throughput_tok_s"]}
        for policy in ("regenerate", "continue"):
            tokens = sum(expected_decode(length, out, max_new, room, policy).total for length in suite["lengths"])
            tokens *= suite["examples_per_length"] * n_datasets
            row[f"{policy}_tokens"] = tokens
            row[f"{policy}_gpu_hours"] = tokens / model["throughput_tok_s"] / 3600 * model["gpus"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = account(load(args.config))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'model':<8} {'GPUs':>4} {'tok/s':>7} {'regenerate':>12} {'continue':>12} {'GPU-h regen':>12} "
          f"{'GPU-h cont':>11} {'saved':>6}")
    for r in rows:
        saved = 1 - r["continue_tokens"] / r["regenerate_tokens"]
        print(f"{r['abbrev']:<8} {r['gpus']:>4} {r['throughput_tok_s']:>7,.0f} {r['regenerate_tokens'] / 1e9:>10.2f}G "
              f"{r['continue_tokens'] / 1e9:>10.2f}G {r['regenerate_gpu_hours']:>12.1f} {r['continue_gpu_hours']:>11.1f} "
              f"{100 * saved:>5.1f}%")
    regen = sum(r["regenerate_gpu_hours"] for r in rows)
    cont = sum(r["continue_gpu_hours"] for r in rows)
    tokens_regen = sum(r["regenerate_tokens"] for r in rows)
    tokens_cont = sum(r["continue_tokens"] for r in rows)
    print(f"{'all':<8} {'':>4} {'':>7} {tokens_regen / 1e9:>10.2f}G {tokens_cont / 1e9:>10.2f}G {regen:>12.1f} "
          f"{cont:>11.1f} {100 * (1 - tokens_cont / tokens_regen):>5.1f}%")
    print(f"continue / regenerate: {tokens_cont / tokens_regen:.3f} of the decoded tokens, "
          f"{cont / regen:.3f} of the GPU-hours ({regen:.0f} -> {cont:.0f} H200 GPU-hours; the paper: ~300)")


if __name__ == "__main__":
    main()

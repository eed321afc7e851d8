"""The models and generation stages' commands: prepare-model, show-prompt, check-model, infer, collect
(docs/generation.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from procexec import config as config_module
from procexec.cli.options import add_config_option, float_range, load_config, positive_int
from procexec.config.model import Config, VllmServerModel
from procexec.errors import ProcexecError
from procexec.records import Example


def cmd_prepare_model(args: argparse.Namespace) -> None:
    from procexec.generation.job_settings import model_entry
    from procexec.preparation.prepare import prepare_model

    config = load_config(args.config)
    manifest = prepare_model(
        model_entry(config, args.model),
        Path(args.out),
        seed=args.seed,
        models_dir=Path(config.models_dir),
        lock_path=Path(config.model_lock),
    )
    pinned = f" at {manifest['commit']}" if manifest.get("commit") else ""
    print(f"prepared {args.model} ({manifest['source']}{pinned}) -> {args.out}", file=sys.stderr)


def cmd_lock_models(args: argparse.Namespace) -> None:
    """Pin every hub model's revision to its commit (only missing ones; ``--update`` moves the named ones)."""
    from procexec.generation.job_settings import model_entry
    from procexec.preparation.staging import lock_model

    config = load_config(args.config)
    keys = args.update or [k for k in config.generated_models if config.models[k].source == "hf"]
    for key in keys:
        model = model_entry(config, key)
        if model.source != "hf":
            raise ProcexecError(f"--update {key}: source is {model.source}, only hub models (source hf) are locked")
        commit = lock_model(Path(config.model_lock), model, Path(config.models_dir), update=bool(args.update))
        print(f"{key}: {model.hf_id}@{model.revision} -> {commit}")


def work_offline(manifest_path: Path | None) -> None:
    """A job that loads a staged folder never touches the network (set before transformers/vLLM import)."""
    if manifest_path is None:
        return
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


def suite_example(config: Config, example_id: str) -> Example:
    """The example ``example_id`` generated from the config's suite (no dataset file needed)."""
    from procexec.benchmark.suite import expand_suite, generate_example, parse_example_id

    suite = config.suite
    try:
        spec, length, index = parse_example_id(example_id)
    except ProcexecError as exc:
        raise ProcexecError(f"--example: {exc}") from None
    if spec.id not in {s.id for s in expand_suite(suite, subset=False)}:
        raise ProcexecError(f"--example {example_id}: dataset {spec.id} is not in the config's suite")
    if length not in suite.lengths or not 0 <= index < suite.examples_per_length:
        raise ProcexecError(
            f"--example {example_id}: the suite has lengths {suite.lengths} and indices "
            f"0..{suite.examples_per_length - 1}"
        )
    return generate_example(spec, length, index, suite.seed)


def shown_prompt(config: Config, key: str, example_id: str, manifest_path: Path | None) -> dict:
    """What the model's engine would receive for one example, and which weights it is (tokenizer only)."""
    from procexec.benchmark.prompts import chat_messages
    from procexec.engine.prompting import PromptRenderer
    from procexec.generation.job_settings import model_entry
    from procexec.preparation.prepare import model_location

    model = model_entry(config, key)
    example = suite_example(config, example_id)
    work_offline(manifest_path)
    model_ref, manifest = model_location(model, manifest_path)
    template_date = config.inference.template_date
    shown = {
        "model": key,
        "example": example.id,
        "hf_id": model.hf_id,
        "revision": model.revision,
        "commit": manifest.get("commit"),
        "backend": model.backend_kind,
        "tokenizer_mode": model.tokenizer_mode,
        "template_kwargs": model.chat_template_kwargs,
        "template_date": template_date.isoformat(),
    }
    renderer = PromptRenderer.load(model, model_ref, template_date)
    prompt = renderer.render(lambda system_role: chat_messages(example, system_role=system_role), keep_text=True)
    if renderer.tokenizer is None:  # the server renders: its turns
        return {
            **shown,
            "route": "chat",
            "messages": prompt.messages,
            "text": None,
            "token_ids": None,
            "prompt_tokens": None,
            "sha256": None,
            "system_folded": prompt.system_folded,
        }
    decoded = prompt.text if prompt.text is not None else renderer.tokenizer.decode(prompt.token_ids)
    return {
        **shown,
        "route": "token ids",
        "text": prompt.text,
        "decoded": decoded,
        "token_ids": prompt.token_ids,
        "prompt_tokens": prompt.num_tokens,
        "sha256": prompt.sha256,
        "system_folded": prompt.system_folded,
    }


def cmd_show_prompt(args: argparse.Namespace) -> None:
    """Render one example's prompt with the model's tokenizer only: what the engine would receive."""
    from procexec.io.files import atomic_write

    shown = shown_prompt(
        load_config(args.config), args.model, args.example, Path(args.manifest) if args.manifest else None
    )
    if args.out:
        with atomic_write(args.out) as handle:
            json.dump(shown, handle, ensure_ascii=False, indent=1)
            handle.write("\n")
    if args.json:
        print(json.dumps(shown, ensure_ascii=False))
    elif not args.out:
        print(
            f"model {args.model} ({shown['hf_id']}@{shown['commit'] or shown['revision']}, "
            f"tokenizer_mode {shown['tokenizer_mode']}), example {shown['example']}"
        )
        if shown["route"] == "chat":
            print("chat route: the endpoint renders these turns itself")
            print(json.dumps(shown["messages"], ensure_ascii=False, indent=1))
            return
        print(f"prompt tokens: {shown['prompt_tokens']}   sha256: {shown['sha256']}")
        print(
            f"system text folded into the user turn: {'yes' if shown['system_folded'] else 'no'}   "
            f"template kwargs: {json.dumps(shown['template_kwargs'])}   template date: {shown['template_date']}"
        )
        print("token ids:", " ".join(map(str, shown["token_ids"])))
        print(
            "--- rendered text ---"
            if shown["text"] is not None
            else "--- no text: this tokenizer renders chat straight to token ids; decoded for reading ---"
        )
        print(shown["decoded"])


def cmd_check_model(args: argparse.Namespace) -> None:
    """Build vLLM's model configuration from the staged folder with the GPU job's settings; print what it derives."""
    from procexec.cluster.cost.catalog import catalog_for
    from procexec.cluster.cost.throughput import runtime_overhead
    from procexec.generation.job_settings import model_entry
    from procexec.io.files import atomic_write
    from procexec.preparation.model_check import check_model, format_check

    config = load_config(args.config)
    model = model_entry(config, args.model)
    manifest_path = Path(args.manifest) if args.manifest else None
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the check (--json parses it)
    model_dir: str | None = None
    manifest: dict[str, Any] = {}
    if model.stages_weights:
        from procexec.preparation.prepare import model_location

        work_offline(manifest_path)
        model_dir, manifest = model_location(model, manifest_path)
    catalog = catalog_for(config)  # cluster.hardware's GPU and the experts' share as procexec cost counts them
    arch = catalog.models.get(model.abbrev)
    memory = catalog.hardware.memory_bytes if args.gpu_memory_gib is None else args.gpu_memory_gib * 2**30
    check = check_model(
        model,
        model_dir,
        manifest,
        gpu_memory_bytes=memory,
        expert_share=arch.expert_bytes / arch.weight_bytes if arch else 0.0,
        runtime_overhead_bytes=runtime_overhead(arch, catalog.hardware),
    )
    if args.out:
        with atomic_write(args.out) as handle:
            json.dump(check.to_json(), handle, indent=1)
            handle.write("\n")
    print(json.dumps(check.to_json()) if args.json else format_check(check))


def cmd_infer(args: argparse.Namespace) -> None:
    from procexec.generation.job import run_job
    from procexec.generation.job_settings import JobSettings

    config = load_config(args.config)
    if args.model in config.models:
        config_module.check_endpoint_keys(config.model_copy(update={"run_models": [args.model]}))
    settings = JobSettings.from_config(config, args.model)
    if isinstance(settings.model, VllmServerModel):  # the job server's limits, from the study's projection
        from procexec.cluster.job_limits import admission_context, start_ceiling_s

        settings = dataclasses.replace(
            settings,
            server_start_ceiling_s=start_ceiling_s(config, args.model, Path(args.store)),
            admission_context=admission_context(config, args.model, Path(args.store)),
        )
    if args.speculative:
        from procexec.cluster.study_stages import speculative_half

        settings = dataclasses.replace(settings, model=speculative_half(config, args.model))
    work_offline(Path(args.manifest) if args.manifest else None)
    result = run_job(
        settings,
        Path(args.datasets_dir),
        args.datasets,
        args.shard,
        args.num_shards,
        Path(args.store),
        Path(args.out),
        Path(args.manifest) if args.manifest else None,
        progress_interval=None if args.no_progress else args.progress_interval,
    )
    print(
        f"{args.model} shard {args.shard}-of-{args.num_shards}: {len(result.plans)} records, "
        f"{result.generated} generated ({result.decoded_tokens} tokens decoded), {result.cached} from the store, "
        f"{result.wall_time_s:.1f} s",
        file=sys.stderr,
    )


def cmd_status(args: argparse.Namespace) -> None:
    from procexec.cluster.status import format_table, study_status, to_json

    config = load_config(args.config)
    results = Path(args.results)
    if not results.is_dir():
        raise ProcexecError(
            f"--results {results}: no such folder (the workflow's results folder; "
            "run from the workflow's directory or name it)"
        )
    rows = study_status(config, results, verify=args.verify)
    budget = config.cluster.gpu_hours_budget
    print(json.dumps(to_json(rows), allow_nan=False) if args.json else format_table(rows, budget))


def cmd_collect(args: argparse.Namespace) -> None:
    from procexec.generation.collect import collect

    written = collect(
        args.model, [Path(s) for s in args.shards], Path(args.datasets_dir), args.datasets, Path(args.out_dir)
    )
    print(f"{args.model}: collected {sum(written.values())} records into {len(written)} file(s)", file=sys.stderr)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prepare-model", help="make a configured model loadable and write its manifest")
    add_config_option(p)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--out", required=True, help="manifest .json; local models are built into hf/ beside it")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny-llama recipe; default: %(default)s")
    p.set_defaults(func=cmd_prepare_model)

    p = subparsers.add_parser("lock-models", help="pin each hub model's revision to a commit in the lock file")
    add_config_option(p)
    p.add_argument("--update", nargs="+", metavar="KEY", help="re-resolve these models (moves their locks on purpose)")
    p.set_defaults(func=cmd_lock_models)

    p = subparsers.add_parser(
        "show-prompt", help="print what the engine would receive for one example (tokenizer only)"
    )
    add_config_option(p)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--example", required=True, help="example id as in the datasets, e.g. add_int_1-10_k1:5:0")
    p.add_argument("--manifest", help="manifest from prepare-model (where the model's files are)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument("--out", help="also write the JSON object to this file (the workflow's results/prompts/KEY.json)")
    p.set_defaults(func=cmd_show_prompt)

    p = subparsers.add_parser(
        "check-model",
        help="build vLLM's model config from the staged folder (no GPU): "
        "architecture, lengths, dtype, KV bytes per token, sequences that fit",
    )
    add_config_option(p)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--manifest", help="manifest from prepare-model (where the model's files are)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument(
        "--out", help="also write the JSON object to this file (the workflow's results/models/KEY/check.json)"
    )
    p.add_argument(
        "--gpu-memory-gib",
        type=float_range(1, 10000),
        default=None,
        help="memory of one GPU, GiB; default: cluster.hardware's (data/hardware.yaml), as procexec cost",
    )
    p.set_defaults(func=cmd_check_model)

    p = subparsers.add_parser("infer", help="generate one shard of a model's outputs (resumable)")
    add_config_option(p)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--datasets-dir", required=True)
    p.add_argument("--datasets", nargs="+", required=True, help="dataset ids")
    p.add_argument("--shard", type=positive_int, default=1, help="which shard, 1..N; default: %(default)s")
    p.add_argument("--num-shards", type=positive_int, default=1, help="N; default: %(default)s")
    p.add_argument("--store", required=True, help="resumable store directory (not a workflow output)")
    p.add_argument("--out", required=True, help="shard records, .jsonl.gz")
    p.add_argument("--manifest", help="manifest from prepare-model (required for local sources)")
    p.add_argument(
        "--progress-interval",
        type=float_range(1, 86400),
        default=60.0,
        help="seconds between progress lines on stderr, 1..86400; default: %(default)s",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.add_argument(
        "--speculative",
        action="store_true",
        help="the pilot's speculative half: the model with the config's pilot_speculative as its speculative_config",
    )
    p.set_defaults(func=cmd_infer)

    p = subparsers.add_parser("status", help="per model: generations done, tokens, GPU-hours, ETA (while it runs)")
    add_config_option(p, what="the workflow's config (config.yaml, then the run's --configfile overlays)")
    p.add_argument("--results", default="results", help="the workflow's results folder; default: %(default)s")
    p.add_argument("--json", action="store_true", help="a JSON list, one object per model")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every stored record and name, in one warning line each, those the next infer drops "
        "(damaged, foreign, over budget, outside the vocabulary); they are not counted",
    )
    p.set_defaults(func=cmd_status)

    p = subparsers.add_parser("collect", help="merge shard files into one {dataset}.jsonl.gz per dataset")
    p.add_argument("--model", required=True)
    p.add_argument("--shards", nargs="+", required=True)
    p.add_argument("--datasets-dir", required=True)
    p.add_argument("--datasets", nargs="+", required=True)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_collect)

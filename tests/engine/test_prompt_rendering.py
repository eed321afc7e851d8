"""Prompts exactly as each model's engine receives them (issue: model fidelity).

Oracles, strongest first: vLLM's own ``LLM.chat`` (its chat renderer for the
tokenizer mode) on a tiny random model that carries the real tokenizer file;
mistral_common's own ``encode_chat_completion``; the tokenizer's own
``apply_chat_template(tokenize=True)``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json

import pytest
import yaml

from cli_runs import procexec_in_process
from config_changes import changed_config
from model_fixtures import (
    MISTRAL_TOKENIZERS,
    clock_template_dir,
    mistral_common_file,
    mistral_model_dir,
)
from procexec.benchmark.prompts import SYSTEM_PROMPT
from procexec.engine.tokenizer import ids_sha256, load_tokenizer, render_prompt
from procexec.errors import ProcexecError

# Every test here loads vLLM's own tokenizers or engine (the oracle for procexec's rendering).
pytestmark = pytest.mark.vllm

DAY = dt.date(2026, 1, 1)
USER = "Procedure:\nfunction(x, y):\nLet S1 = x\nLet S2 = y\nStep 1: S3 = S1 + S2\nFinal Step: Return S3\n\nInputs:\nx = 5, y = 8"


def messages_for(system_role: bool) -> list[dict[str, str]]:
    if system_role:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER}]
    return [{"role": "user", "content": f"{SYSTEM_PROMPT}\n\n{USER}"}]


def mistral_common_ids(kind: str, system_role: bool) -> list[int]:
    """mistral_common's own encoding of the same turns (independent of vLLM)."""
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(mistral_common_file(MISTRAL_TOKENIZERS[kind][1])))
    turns = [
        SystemMessage(content=m["content"]) if m["role"] == "system" else UserMessage(content=m["content"])
        for m in messages_for(system_role)
    ]
    return tokenizer.encode_chat_completion(ChatCompletionRequest(messages=turns)).tokens


@pytest.mark.parametrize("system_role", [True, False], ids=["system-role", "folded"])
@pytest.mark.parametrize("kind", sorted(MISTRAL_TOKENIZERS))
def test_mistral_tokenizers_render_control_ids_not_their_text(kind, system_role, tmp_path):
    folder = mistral_model_dir(tmp_path, kind)
    tokenizer = load_tokenizer(str(folder), "mistral", False)
    prompt = render_prompt(tokenizer, messages_for, system_role, {}, DAY, keep_text=True)
    ids = prompt.token_ids
    bos, inst = tokenizer.convert_tokens_to_ids(["<s>", "[INST]"])
    assert ids[:2] == [bos, inst] == [1, 3]  # the control ids, never "<s>[INST]" spelled as text pieces
    assert ids == mistral_common_ids(kind, system_role)
    assert ids == list(tokenizer.apply_chat_template(messages_for(system_role), tokenize=True))
    assert prompt.sha256 == ids_sha256(ids) and prompt.text is None and prompt.system_folded is not system_role


def test_the_old_text_path_would_have_corrupted_the_mistral_prompt(tmp_path):
    """What the issue measured: text rendering + re-encoding spells the control tokens as text."""
    tokenizer = load_tokenizer(str(mistral_model_dir(tmp_path, "sentencepiece-v3")), "mistral", False)
    text = tokenizer.apply_chat_template(messages_for(True), tokenize=False)
    reencoded = tokenizer.encode(text, add_special_tokens=False)
    assert reencoded[:2] != [1, 3]
    assert render_prompt(tokenizer, messages_for, True, {}, DAY).token_ids[:2] == [1, 3]


def test_hf_text_templates_are_encoded_without_a_second_bos(tiny_manifest):
    tokenizer = load_tokenizer(str(tiny_manifest.parent / "hf"), "auto", False)
    prompt = render_prompt(tokenizer, messages_for, True, {}, DAY, keep_text=True)
    assert prompt.token_ids == tokenizer.encode(prompt.text, add_special_tokens=False)
    assert prompt.text.startswith("<|im_start|>system\n")


def fake_clock(monkeypatch, today: dt.date) -> type:
    """Make transformers' template clock (``strftime_now``) say ``today``; returns the fake class."""
    from transformers.utils import chat_template_utils

    class FakeDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls.combine(today, dt.time(23, 59), tzinfo=tz)

    monkeypatch.setattr(chat_template_utils, "datetime", FakeDatetime)
    return FakeDatetime


def test_a_template_that_reads_the_clock_renders_the_configured_date(tiny_manifest, tmp_path, monkeypatch):
    from transformers.utils import chat_template_utils

    tokenizer = load_tokenizer(str(clock_template_dir(tiny_manifest.parent / "hf", tmp_path)), "auto", False)
    rendered = {}
    for fake_today in (dt.date(2026, 3, 1), dt.date(2027, 7, 9)):
        FakeDatetime = fake_clock(monkeypatch, fake_today)
        unpinned = tokenizer.apply_chat_template(messages_for(True), tokenize=False, add_generation_prompt=True)
        assert f"Current date: {fake_today.isoformat()}" in unpinned  # the template really reads the clock
        rendered[fake_today] = render_prompt(tokenizer, messages_for, True, {}, DAY, keep_text=True)
        assert chat_template_utils.datetime is FakeDatetime  # the pin is undone afterwards
    first, second = rendered.values()
    assert "Current date: 2026-01-01" in first.text
    assert first.token_ids == second.token_ids and first.sha256 == second.sha256


def test_store_keys_do_not_depend_on_the_day_the_job_runs(
    tiny_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch
):
    from procexec.generation.backends import create_backend
    from procexec.generation.job import Job, load_examples
    from procexec.generation.job_settings import JobSettings

    config = changed_config(
        tiny_config, models={"tiny-nosys": {"path": str(clock_template_dir(tiny_manifest.parent / "hf", tmp_path))}}
    )
    examples = load_examples(*tiny_datasets)
    keys = []
    for fake_today in (dt.date(2026, 3, 1), dt.date(2026, 3, 2)):
        fake_clock(monkeypatch, fake_today)
        settings = JobSettings.from_config(config, "tiny-nosys")
        backend = create_backend(settings, None)
        job = Job(settings, examples, tmp_path / "store", "1-of-1", backend, progress_interval=None)
        keys.append([p.key for p in job.plan_first()])
    assert keys[0] == keys[1]


# ----------------------------------------------------------------------------- tokenizer modes and engine args


def test_every_tokenizer_mode_the_schema_allows_is_registered_in_vllm():
    from vllm.tokenizers.registry import TokenizerRegistry

    from procexec.config.schema import schema

    allowed = schema()["$defs"]["VllmModel"]["properties"]["tokenizer_mode"]["enum"]
    registered = set(TokenizerRegistry.tokenizers) | {"auto"}
    assert set(allowed) <= registered, set(allowed) - registered
    assert {"auto", "hf", "mistral", "deepseek_v32"} <= set(allowed)


def test_engine_arguments_of_every_configured_model_are_vllm_engine_args(tmp_path, request):
    """The 15 paper models and the CPU default, as the GPU and the CPU job would pass them."""
    from procexec.cluster.layouts import load_planned
    from procexec.engine.arguments import check_engine_args, engine_settings

    config = load_planned([request.config.rootpath / "config.yaml"])
    assert len(config.models) >= 16
    for key, model in config.models.items():
        for device in ("cuda", "cpu"):
            settings = engine_settings(model, device, str(tmp_path))
            check_engine_args(settings, f"models.{key}")
    from vllm.engine.arg_utils import EngineArgs

    EngineArgs(**engine_settings(config.models["ds-685"], "cuda", str(tmp_path)))  # vLLM itself accepts them


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"max_num_seqz": 4}, "'max_num_seqz' is not a vLLM"),
        ({"max_num_seqs": "four"}, "'max_num_seqs' = 'four'"),
        ({"enforce_eager": "yes"}, "'enforce_eager' = 'yes'"),
        ({"dtype": "bf16"}, "'dtype' = 'bf16'"),
        ({"kernel_config": {"enable_flashinfer_autotunez": False}}, "'kernel_config' = "),
    ],
)
def test_a_wrong_engine_argument_is_named_before_any_engine(extra, message, tmp_path):
    from procexec.engine.arguments import check_engine_args

    with pytest.raises(ProcexecError, match=message):
        check_engine_args({"model": str(tmp_path), **extra}, "models.x.engine_kwargs")


# ----------------------------------------------------------------------------- the engine's own renderer


@pytest.mark.parametrize("mode", ["mistral-sentencepiece-v3", "deepseek_v32"])
def test_vllm_chat_gives_the_engine_the_ids_procexec_renders(mode, tiny_manifest, tmp_path, monkeypatch):
    """vLLM's LLM.chat (its own renderer for the mode) and procexec's rendering feed the engine the same ids.

    The engine runs in this process, as a job's does (``procexec.engine.arguments``' environment)."""
    from vllm import LLM, SamplingParams

    for name, value in (
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        ("OMP_NUM_THREADS", "1"),
        ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        ("TORCHDYNAMO_DISABLE", "1"),
        ("HF_HUB_OFFLINE", "1"),
    ):
        monkeypatch.setenv(name, value)
    if mode == "deepseek_v32":
        folder, tokenizer_mode, kwargs = tiny_manifest.parent / "hf", "deepseek_v32", {"thinking": True}
    else:
        folder, tokenizer_mode, kwargs = mistral_model_dir(tmp_path, "sentencepiece-v3", weights=True), "mistral", {}
    turns = messages_for(True)
    llm = LLM(
        model=str(folder),
        tokenizer_mode=tokenizer_mode,
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_memory_bytes=64 << 20,
    )
    greedy_one = SamplingParams(max_tokens=1, temperature=0)
    try:
        ours = render_prompt(load_tokenizer(str(folder), tokenizer_mode, False), lambda _: turns, True, kwargs, DAY)
        theirs = llm.chat(turns, greedy_one, use_tqdm=False, chat_template_kwargs=kwargs)[0].prompt_token_ids
        fed = llm.generate([{"prompt_token_ids": ours.token_ids}], greedy_one, use_tqdm=False)[0].prompt_token_ids
    finally:
        del llm
    assert ours.token_ids == list(theirs) == list(fed)
    if mode == "deepseek_v32":  # thinking on: the assistant turn opens with <think>
        tokenizer = load_tokenizer(str(folder), "deepseek_v32", False)
        assert tokenizer.decode(ours.token_ids).endswith("<｜Assistant｜><think>")


# ----------------------------------------------------------------------------- procexec show-prompt


def _show_prompt(config_path, model, example, *extra):
    """``procexec show-prompt`` in this process (tests/cli_runs.py): the worker has vLLM's tokenizers imported."""
    return procexec_in_process("show-prompt", "--config", config_path, "--model", model, "--example", example, *extra)


def _config_with(tmp_path, tiny_raw_config, **models):
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"].update(models)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_show_prompt_on_the_tiny_llama_and_a_mistral_folder(tiny_raw_config, tiny_manifest, tmp_path):
    from procexec.benchmark.prompts import chat_messages
    from procexec.benchmark.suite import DatasetSpec, generate_example
    from procexec.config import prepare

    folder = mistral_model_dir(tmp_path, "tekken")
    mistral = {
        "abbrev": "MIS",
        "hf_id": "mistralai/x",
        "source": "path",
        "path": str(folder),
        "gpus": 0,
        "shards": 1,
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
        "tokenizer_mode": "mistral",
    }
    config_path = _config_with(tmp_path, tiny_raw_config, mistral=mistral)
    example_id = "add_int_1-10_k1:5:3"
    example = generate_example(DatasetSpec.from_id("add_int_1-10_k1"), 5, 3, seed=1)

    proc = _show_prompt(config_path, "mistral", example_id, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    expected = load_tokenizer(str(folder), "mistral", False).apply_chat_template(chat_messages(example), tokenize=True)
    assert shown["token_ids"] == list(expected) and shown["token_ids"][:2] == [1, 3]
    assert shown["text"] is None and shown["prompt_tokens"] == len(expected)
    assert shown["sha256"] == ids_sha256(expected) and shown["system_folded"] is False

    proc = _show_prompt(config_path, "tiny", example_id, "--manifest", str(tiny_manifest), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert shown["text"].startswith("<|im_start|>system\nYou are a deterministic procedure executor.")
    assert "x = " in shown["text"] and shown["prompt_tokens"] == len(shown["token_ids"])
    # the same ids the generation job hashes into its store key
    from procexec.generation.backends import create_backend
    from procexec.generation.job_settings import JobSettings

    config = prepare(yaml.safe_load(config_path.read_text()))
    backend = create_backend(JobSettings.from_config(config, "tiny"), tiny_manifest)
    assert backend.render(lambda s: chat_messages(example, system_role=s)).sha256 == shown["sha256"]

    text = _show_prompt(config_path, "tiny", example_id, "--manifest", str(tiny_manifest))
    assert text.returncode == 0 and f"prompt tokens: {shown['prompt_tokens']}" in text.stdout

    for bad, flag in (
        ("add_int_1-10_k1:7:0", "--example"),
        ("nonsense", "--example"),
        ("add_int_1-10_k1:5:99", "--example"),
    ):
        proc = _show_prompt(config_path, "tiny", bad, "--manifest", str(tiny_manifest))
        assert proc.returncode == 2 and flag in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.smollm2
def test_show_prompt_on_the_smollm2_default(smollm2_manifest, request):
    proc = _show_prompt(
        request.config.rootpath / "config.yaml",
        "smollm2-135m-instruct",
        "mixed_float_1-10_k1:15:0",
        "--manifest",
        str(smollm2_manifest),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert shown["text"].startswith("<|im_start|>system\nYou are a deterministic procedure executor.")
    assert shown["text"].endswith("<|im_start|>assistant\n") and shown["prompt_tokens"] > 300


def _broken_copy(tiny_manifest, tmp_path, breakage: str):
    import shutil

    folder = tmp_path / breakage
    shutil.copytree(tiny_manifest.parent / "hf", folder)
    if breakage == "no-template":
        for name in ("chat_template.jinja", "chat_template.json"):
            (folder / name).unlink(missing_ok=True)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    else:  # JSON, but not a tokenizer
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    return folder


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no-template", "the chat template of '.*no-template' cannot render the prompt"),
        ("not-a-tokenizer", "cannot load the tokenizer of '.*not-a-tokenizer'"),
    ],
)
def test_a_broken_tokenizer_or_template_is_one_line_in_show_prompt_and_infer(
    breakage, message, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path, capsys
):
    import re

    from procexec.cli import main

    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["broken"] = {
        **raw["models"]["tiny"],
        "source": "path",
        "path": str(_broken_copy(tiny_manifest, tmp_path, breakage)),
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    directory, ids = tiny_datasets
    runs = {
        "show-prompt": [
            "show-prompt",
            "--config",
            str(config),
            "--model",
            "broken",
            "--example",
            "add_int_1-10_k1:5:0",
        ],
        "infer": [
            "infer",
            "--config",
            str(config),
            "--model",
            "broken",
            "--datasets-dir",
            str(directory),
            "--datasets",
            *ids,
            "--store",
            str(tmp_path / "store"),
            "--out",
            str(tmp_path / "out.jsonl.gz"),
            "--no-progress",
        ],
    }
    for command, argv in runs.items():
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"procexec {command}: error: "), err
        assert re.search(message, err), err
    assert not (tmp_path / "out.jsonl.gz").exists() and not (tmp_path / "store").exists()

"""Nested config values checked as vLLM checks them (issue 30, root causes 1, 2, 5): serve_args parsed like
``vllm serve``, speculative_config like ``SpeculativeConfig``, request_extra without the job's own fields.

The vLLM-free parser is held to the installed vLLM's (its flag table, its answers on the same spellings); the
config check's refusals go through ``procexec check-config``: one line, exit 2, naming the key.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from procexec.cli import main
from procexec.config.request_extra import OWNED_REQUEST_FIELDS
from procexec.config.serve_args import CONVERTERS, FLAGS_FILE, ServeArgsError, parse_serve_args, serve_values
from procexec.config.speculative import SPECULATIVE_INT_MINIMUM, SPECULATIVE_METHODS

RAW = yaml.safe_load((Path(__file__).resolve().parents[2] / "config.yaml").read_text())

#: Spellings vLLM accepts and the values they mean, and spellings it refuses.
SPELLINGS = [
    ["--tensor_parallel_size", "2", "--data_parallel_size=4"],
    ["-dp=8", "--max-num-se", "16", "-ep"],
    ["--max-num-seq", "16", "--enable-expert-parallel", "--no-enable-expert-parallel"],
    ["--max_num_seqs=32", "--data-parallel-size", "2", "--data-parallel-size", "3"],
    ["--enable_expert_parallel", "--max-model", "32k"],
    ["--kv-cache-dtype", "fp8_e5m2", "--moe-backend", "Flashinfer-Cutlass", "--max-num-batched-tokens", "25.6k"],
    ["--max-model-len", "auto", "--kv-cache-memory-bytes", "None", "--max-lora-rank", "16", "--dtype=half"],
    ["--limit-mm-per-prompt", '{"image": 0}', "--mamba-ssu-algorithm", "None", "--gpu-memory-utilization", "0.8"],
]
REFUSED = [
    ["--max-num-seqs", "many"],
    ["--max", "3"],
    ["--data-parallel", "2"],
    ["--bogus-flag"],
    ["extra-positional"],
    ["-dp"],
    ["--kv-cache-dtype", "no-such-dtype"],
    ["--moe-backend", "no-such-kernel"],
    ["--max-lora-rank", "7"],
    ["--max-num-batched-tokens", "1.5K"],
    ["--max-model-len", "lots"],
    ["--gpu-memory-utilization", "most"],
    ["--limit-mm-per-prompt", "{image: 0}"],
    ["--kv-offloading-size", "big"],
]


def _vllm_serve_parser() -> Any:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    return ServeSubcommand().subparser_init(parser.add_subparsers(required=True, dest="subparser"))


@pytest.fixture(scope="module")
def vllm_serve() -> Any:
    return _vllm_serve_parser()


def _kind(converter: Any) -> str:
    """The name in serve_args.CONVERTERS of one of vLLM's value converters, found by what it is."""
    from vllm.utils import argparse_utils

    if converter in (None, str, int, float):
        return getattr(converter, "__name__", "str")
    if converter is json.loads:
        return "json"
    named = {
        argparse_utils.human_readable_int: "human int",
        argparse_utils.human_readable_int_or_auto: "human int or auto",
    }
    if converter in named:
        return named[converter]
    wrapped = inspect.getclosurevars(converter).nonlocals.get("return_type")
    if converter.__qualname__.startswith("optional_type."):
        return "optional " + _kind(wrapped)
    if converter.__qualname__.startswith("parse_type."):  # converts with wrapped, refusing what it refuses
        return _kind(wrapped)
    if 'lower().replace("-", "_")' in inspect.getsource(converter):
        return "backend name"
    return "str"  # a JSON dataclass or --device-ids: vLLM validates those values at start


def _bounds(action: argparse.Action, groups: dict[str, str]) -> dict[str, Any] | None:
    """vLLM's bounds on a flag's value: the ``ge``/``gt``/``le``/``lt`` of the pydantic ``Field`` of the config
    dataclass field it sets (``EngineArgs.add_cli_args`` names each argument group after its class,
    vllm/engine/arg_utils.py), with the class's name (``of``); None: unbounded there."""
    import vllm.config

    config = getattr(vllm.config, groups.get(action.dest, ""), None)
    field = getattr(config, "__pydantic_fields__", {}).get(action.dest)
    bounds = {
        k: getattr(m, k) for m in (field.metadata if field else []) for k in ("ge", "gt", "le", "lt") if hasattr(m, k)
    }
    return {**bounds, "of": groups[action.dest]} if bounds else None


def _table_row(action: argparse.Action, groups: dict[str, str]) -> list:
    choices = None if action.choices is None else list(action.choices)
    return [action.option_strings, action.dest, action.nargs, _kind(action.type), choices, _bounds(action, groups)]


def _flag_table(vllm_serve: Any) -> list[list]:
    groups = {a.dest: g.title for g in vllm_serve._action_groups for a in g._group_actions}
    return [_table_row(a, groups) for a in vllm_serve._actions if a.option_strings and a.dest != "help"]


@pytest.mark.vllm
def test_the_flag_table_is_the_installed_vllm_serve_parser(vllm_serve):
    rows = _flag_table(vllm_serve)
    assert {kind.removeprefix("optional ") for _, _, _, kind, _, _ in rows} <= CONVERTERS.keys()
    assert next(row[5] for row in rows if row[1] == "stream_interval") == {"ge": 1, "of": "SchedulerConfig"}
    assert json.loads(FLAGS_FILE.read_text()) == rows, "regenerate it: python tests/config/test_serve_args.py"


@pytest.mark.vllm
@pytest.mark.parametrize("argv", SPELLINGS + REFUSED, ids=lambda a: " ".join(a))
def test_the_parser_reads_what_vllm_serve_reads(vllm_serve, argv):
    try:
        theirs = vars(vllm_serve.parse_args(["model", *argv]))
    except SystemExit:
        with pytest.raises(ServeArgsError):
            parse_serve_args(argv)
        return
    ours = parse_serve_args(argv)
    for dest in ("tensor_parallel_size", "data_parallel_size", "max_num_seqs", "enable_expert_parallel"):
        if dest in ours.given:  # else vLLM's default, which the workflow's own default stands for
            assert getattr(ours, dest) == theirs[dest], dest
    assert {dest: theirs[dest] for dest in ours.given} == serve_values(argv)


@pytest.mark.vllm
def test_the_bounds_are_vllm_config_bounds():
    from pydantic import ValidationError
    from vllm.config.parallel import ParallelConfig
    from vllm.config.scheduler import SchedulerConfig
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    with pytest.raises(ValidationError):
        ParallelConfig(data_parallel_size=0)
    with pytest.raises(ValidationError):
        SchedulerConfig(max_num_seqs=0, max_model_len=64, is_encoder_decoder=False)

    def flat(literal: Any) -> set[str]:
        return {n for a in get_args(literal) for n in (flat(a) if get_args(a) else {a})}

    assert SPECULATIVE_METHODS == flat(SpeculativeMethod)
    fields = SpeculativeConfig.__pydantic_fields__
    for name, minimum in SPECULATIVE_INT_MINIMUM.items():
        bound = {type(m).__name__: m for m in fields[name].metadata}
        assert (bound["Gt"].gt + 1 if "Gt" in bound else bound["Ge"].ge) == minimum, name


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("dest", "value"), [("sse_keep_alive_interval", -1), ("grpc_port", 70000), ("stream_interval", 0)]
)
def test_a_value_out_of_vllm_s_range_is_one_vllm_serve_refuses(vllm_serve, dest, value):
    """The frontend's own checks (FRONTEND_BOUNDS) and a config dataclass's Field bound, as vLLM 0.32 applies
    them: validate_parsed_serve_args on the parsed flags, the config class on the value."""
    from pydantic import ValidationError
    from vllm.config.scheduler import SchedulerConfig
    from vllm.entrypoints.launchers import cli_args

    flag = "--" + dest.replace("_", "-")
    with pytest.raises(ServeArgsError, match=f"^{flag} {value}: must be "):
        parse_serve_args([flag, str(value)])
    if dest == "stream_interval":
        with pytest.raises(ValidationError, match="stream_interval"):
            SchedulerConfig(stream_interval=value, max_model_len=64, is_encoder_decoder=False)
        return
    args = vllm_serve.parse_args(["model", flag, str(value)])
    with pytest.raises(ValueError, match=flag):
        with pytest.MonkeyPatch.context() as patch:  # the gRPC check runs on the Rust frontend only
            patch.setattr(cli_args.envs, "VLLM_USE_RUST_FRONTEND", True, raising=False)
            args.subparser = "serve"
            cli_args.validate_parsed_serve_args(args)


@pytest.mark.vllm
def test_the_owned_request_fields_are_vllm_request_fields():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    known = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert set(OWNED_REQUEST_FIELDS) <= known, set(OWNED_REQUEST_FIELDS) - known


def test_the_workflow_s_values_come_from_the_parse():
    parsed = parse_serve_args(["--tensor_parallel_size", "2", "-dp=4", "--max-num-se", "8", "-ep"])
    assert (parsed.tensor_parallel_size, parsed.data_parallel_size, parsed.max_num_seqs) == (2, 4, 8)
    assert parsed.enable_expert_parallel is True
    assert parse_serve_args(["-ep", "--no-enable-expert-parallel"]).enable_expert_parallel is False
    assert parse_serve_args([]).data_parallel_size == 1


def _check_config(tmp_path, capsys, mutate) -> tuple[int, str]:
    """``check-config`` on config.yaml changed by ``mutate``: (exit code, stderr); the file left as it was."""
    raw = copy.deepcopy(RAW)
    mutate(raw)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    before = path.read_bytes()
    code = main(["check-config", str(path)])
    err = capsys.readouterr().err
    assert path.read_bytes() == before and "Traceback" not in err
    return code, err.strip()


def _server(**fields: Any):
    """DS-685 with these fields, its layout pinned as it runs on one H200 node (gpus 8, tensor parallel 2)."""

    def mutate(raw: dict) -> None:
        raw["models"]["ds-685"].update({"gpus": 8, "tensor_parallel_size": 2, **fields})

    return mutate


def _spec(**fields: Any):
    def mutate(raw: dict) -> None:
        raw["models"]["qw-4"]["speculative_config"] = fields

    return mutate


def _endpoint_extra(**fields: Any):
    def mutate(raw: dict) -> None:
        raw["models"]["ds-685"]["request_extra"] = fields

    return mutate


def _guard(**fields: Any):
    def mutate(raw: dict) -> None:
        raw["inference"]["rerun_repetition_guard"] = fields

    return mutate


#: Config mutations vLLM or the job would refuse, and what the one line names.
REFUSALS = {
    "dp 0": (_server(serve_args=["--data-parallel-size", "0"]), "models.ds-685.serve_args: --data-parallel-size 0"),
    "stream interval 0": (
        _server(serve_args=["--stream-interval", "0"]),
        "models.ds-685.serve_args: --stream-interval 0: must be at least 1 (vLLM's SchedulerConfig)",
    ),
    "stream interval -4": (_server(serve_args=["--stream-interval=-4"]), "--stream-interval -4: must be at least 1"),
    "memory share 1.5": (
        _server(serve_args=["--gpu-memory-utilization", "1.5"]),
        "--gpu-memory-utilization 1.5: must be at most 1 (vLLM's CacheConfig)",
    ),
    "lookup min > max": (
        _spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=6, prompt_lookup_max=2),
        "models.qw-4.speculative_config.prompt_lookup_min: 6 exceeds prompt_lookup_max 2",
    ),
    "ngram without depth": (
        _spec(method="ngram", prompt_lookup_max=2),
        "models.qw-4.speculative_config.num_speculative_tokens: required with method ngram",
    ),
    "draft tp in the wrong field": (
        _spec(method="ngram", num_speculative_tokens=3, tensor_parallel_size=2),
        "models.qw-4.speculative_config.tensor_parallel_size: set draft_tensor_parallel_size instead",
    ),
    "suffix probability": (
        _spec(method="suffix", suffix_decoding_min_token_prob=1.5),
        "models.qw-4.speculative_config.suffix_decoding_min_token_prob: 1.5 must be in [0, 1]",
    ),
    "dspark's topk elsewhere": (
        _spec(method="mtp", num_speculative_tokens=1, dspark_draft_topk=4),
        "models.qw-4.speculative_config.dspark_draft_topk: only for method dspark",
    ),
    "the pilot's lookup min > max": (
        lambda raw: raw.update(
            pilot_speculative={
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 6,
                "prompt_lookup_max": 2,
            }
        ),
        "pilot_speculative.prompt_lookup_min: 6 exceeds prompt_lookup_max 2",
    ),
    "max-num-seqs many": (
        _server(serve_args=["--max-num-seqs", "many"]),
        "models.ds-685.serve_args: argument --max-num-seqs: invalid int value: 'many'",
    ),
    "underscore tp": (
        _server(serve_args=["--tensor_parallel_size", "8"]),
        "--tensor-parallel-size is not a serve_args flag (set models.ds-685.tensor_parallel_size",
    ),
    "abbreviated max-model-len": (
        _server(serve_args=["--max-model", "32k"]),
        "--max-model-len is not a serve_args flag (set models.ds-685.max_model_len",
    ),
    "underscore dp too wide": (
        _server(serve_args=["--data_parallel_size", "8"]),
        "data parallel 8 x tensor_parallel_size 2 needs 16 GPUs, but gpus is 8",
    ),
    "ambiguous": (_server(serve_args=["--max", "3"]), "models.ds-685.serve_args: ambiguous option: --max"),
    "unknown flag": (_server(serve_args=["--no-such-flag"]), "unrecognized arguments: --no-such-flag"),
    "not a choice": (
        _server(serve_args=["--kv-cache-dtype", "no-such-dtype"]),
        "models.ds-685.serve_args: argument --kv-cache-dtype: invalid choice: 'no-such-dtype' (choose from 'auto',",
    ),
    "not a size": (
        _server(serve_args=["--max-num-batched-tokens", "1.5K"]),
        "models.ds-685.serve_args: argument --max-num-batched-tokens: invalid human_int value: '1.5K'",
    ),
    "speculative flag": (
        _server(serve_args=["--speculative_config", '{"method": "ngram-fast"}']),
        "--speculative-config is not a serve_args flag (set models.ds-685.speculative_config",
    ),
    "flags from a file": (_server(serve_args=["--config", "flags.yaml"]), "--config is not a serve_args flag"),
    "unknown method": (
        _spec(method="ngram-fast", num_speculative_tokens=3),
        "models.qw-4.speculative_config.method: 'ngram-fast' is not a speculative method",
    ),
    "float tokens": (
        _spec(method="ngram", num_speculative_tokens=2.5),
        "models.qw-4.speculative_config.num_speculative_tokens: 2.5 is not a whole number",
    ),
    "zero tokens": (
        _spec(method="ngram", num_speculative_tokens=0),
        "models.qw-4.speculative_config.num_speculative_tokens: 0 must be at least 1",
    ),
    "extra max_tokens": (_endpoint_extra(max_tokens=2), "models.ds-685.request_extra.max_tokens: the job owns"),
    "extra temperature": (_endpoint_extra(temperature=0.9), "models.ds-685.request_extra.temperature"),
    "extra stop": (_endpoint_extra(stop=["\n"]), "models.ds-685.request_extra.stop"),
    "extra n": (_endpoint_extra(n=2), "models.ds-685.request_extra.n"),
    "extra prompt": (_endpoint_extra(prompt="x"), "models.ds-685.request_extra.prompt"),
    "guard min > max": (
        _guard(max_pattern_size=4, min_pattern_size=8, min_count=3),
        "inference.rerun_repetition_guard.min_pattern_size: 8 exceeds max_pattern_size 4",
    ),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_check_config_refuses_in_one_line(tmp_path, capsys, name):
    mutate, named = REFUSALS[name]
    code, err = _check_config(tmp_path, capsys, mutate)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("procexec check-config: error: "), err
    assert named in err, err


def test_what_vllm_accepts_passes(tmp_path, capsys):
    def mutate(raw: dict) -> None:
        _server(serve_args=["--data_parallel_size=4", "-ep", "--max-num-se", "64"])(raw)
        _spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4)(raw)
        _endpoint_extra(top_k=20, min_p=0.0, repetition_penalty=1.0)(raw)
        _guard(max_pattern_size=8, min_pattern_size=8, min_count=3)(raw)

    code, err = _check_config(tmp_path, capsys, mutate)
    assert code == 0, err


if __name__ == "__main__":  # regenerates the flag table from the installed vLLM
    rows = _flag_table(_vllm_serve_parser())
    FLAGS_FILE.write_text("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n", encoding="utf-8")

"""Config validation: bad keys are named, before anything runs."""

import copy
from pathlib import Path

import pytest
import yaml

from procexec import config as config_module
from procexec.benchmark.suite import default_suite, expand_suite
from procexec.cluster.layouts import load_planned, planned
from procexec.config.model import Suite, plain
from procexec.errors import ProcexecError

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "config.yaml").read_text())


def test_paper_config_is_valid_and_has_15_models():
    config = load_planned([ROOT / "config.yaml"])
    assert len(config.run_models) == 15
    assert config.models["qw-14"].chat_template_kwargs == {"enable_thinking": True}
    assert config.models["ds-685"].tensor_parallel_size == 2  # x data parallel 4, in the job's server
    with pytest.raises(TypeError):  # one way to read a value, its typed attribute: no mapping view of a section
        config["suite"]


def _broken(mutate):
    config = copy.deepcopy(RAW)
    mutate(config)
    return config


@pytest.mark.parametrize(
    "mutate, named",
    [
        (lambda c: c["suite"].__setitem__("seed", "abc"), "suite.seed"),
        (lambda c: c["models"]["qw-4"].__setitem__("colour", "blue"), "models.qw-4"),
        (lambda c: c["suite"].__setitem__("families", {}), "suite.families"),
        (lambda c: c["suite"].__setitem__("lengths", []), "suite.lengths"),
        (lambda c: c["models"]["qw-4"].pop("hf_id"), "models.qw-4"),
        (lambda c: c["run_models"].append("gpt-9"), "run_models: unknown model key 'gpt-9'"),
        (
            lambda c: c["models"]["ds-685"].update(gpus=1, tensor_parallel_size=2),
            "models.ds-685.tensor_parallel_size: 2 is larger than gpus (1)",
        ),
        (  # a pinned layout that does not fit the selected GPU: refused before any GPU is held
            lambda c: (
                c["models"]["ds-685"].update(
                    gpus=8, tensor_parallel_size=2, serve_args=["--data-parallel-size", "4", "--enable-expert-parallel"]
                )
                or c["cluster"].update(hardware="h100")
            ),
            "models.ds-685: TP2 x DP4 + EP does not fit NVIDIA H100 SXM 80GB (80 GB, 8 per node): one sequence of "
            "max_context 163,840 needs 12.8 GB of KV per GPU, the pool holds 0.0 GB",
        ),
        (lambda c: c["models"]["qw-4"].update(source="path", path="/nonexistent/model"), "does not exist"),
        (lambda c: c["suite"].__setitem__("datasets", ["add_int_1-10_k9"]), "suite.datasets: unknown dataset id"),
    ],
)
def test_bad_config_names_the_key(mutate, named):
    with pytest.raises(ProcexecError) as info:  # the config read as every command reads it: layouts planned
        planned(config_module.prepare(_broken(mutate), "config.yaml"), "config.yaml")
    assert named in str(info.value)


def test_dataset_subset_narrows_the_suite():
    suite = copy.deepcopy(RAW["suite"])
    suite["datasets"] = ["add_int_1-10_k1", "mixed_float_0-1_k7"]
    assert [s.id for s in expand_suite(Suite.model_validate(suite))] == ["add_int_1-10_k1", "mixed_float_0-1_k7"]


def test_the_commented_endpoint_examples_in_config_yaml_are_valid(request, monkeypatch):
    """Uncommented, the endpoint examples validate; each names a model of the paper's study."""
    import re

    import yaml

    from procexec.config import check_endpoint_keys, prepare

    text = (request.config.rootpath / "config.yaml").read_text()
    block = text.split("# --- endpoint examples")[1].split("# --- end endpoint examples")[0]
    lines = block.splitlines()
    first = next(i for i, line in enumerate(lines) if re.fullmatch(r"  # [a-z0-9.-]+:", line))
    entries = yaml.safe_load("\n".join(line[4:] for line in lines[first:] if line.startswith("  # ")))
    examples = {k: v for k, v in entries.items() if k.endswith("-endpoint")}
    assert sorted(examples) == ["ds-685-endpoint", "kk-1t-endpoint", "oa-120-endpoint"]
    raw = yaml.safe_load(text)
    raw["models"].update(examples)
    raw["run_models"] = list(examples)
    config = prepare(raw)
    abbrevs = {m.abbrev for k, m in config.models.items() if k not in examples}
    for key in examples:
        assert config.models[key].backend == "openai" and config.models[key].abbrev in abbrevs
    monkeypatch.delenv("PROCEXEC_DS685_KEY", raising=False)
    with pytest.raises(
        ProcexecError, match="models.ds-685-endpoint.api_key_env: environment variable PROCEXEC_DS685_KEY"
    ):
        check_endpoint_keys(config)


# ---------------------------------------------------------------- values typed (issue 22)

import datetime as dt  # noqa: E402
import json  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _check_config(tmp_path, capsys, overlay: str, *env):
    from procexec.cli import main

    path = tmp_path / "overlay.yaml"
    path.write_text(overlay)
    code = main(["check-config", str(ROOT / "config.yaml"), str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize(
    "overlay, named",
    [
        (
            "inference:\n  template_date: 2026-02-30\n",
            "inference.template_date: '2026-02-30' is not a calendar date (day is out of range for month, line 2)",
        ),
        (
            "inference:\n  template_date: 2026-01-01\n",
            "inference.template_date: 2026-01-01 is an unquoted YAML date; write it as text ('2026-01-01')",
        ),
        ("inference:\n  top_p: .nan\n", "inference.top_p: nan is not a finite number"),
        ("inference:\n  temperature: .inf\n", "inference.temperature: inf is not a finite number"),
        ("models:\n  qw-4:\n    checkpoint_gb: .NaN\n", "models.qw-4.checkpoint_gb: nan is not a finite number"),
        (
            "models:\n  qw-4:\n    engine_kwargs: {gpu_memory_utilization: -.inf}\n",
            "models.qw-4.engine_kwargs.gpu_memory_utilization: -inf is not a finite number",
        ),
        ("cluster:\n  mem_per_checkpoint: .nan\n", "cluster.mem_per_checkpoint: nan is not a finite number"),
    ],
)
def test_check_config_refuses_a_value_no_schema_keyword_catches_in_one_line(overlay, named, tmp_path, capsys):
    code, out, err = _check_config(tmp_path, capsys, overlay)
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith("procexec check-config: error: invalid configuration (config.yaml + overlay.yaml): ")
    assert named in err[0], err[0]


def test_check_config_and_the_workflow_agree_on_an_unset_endpoint_key(tmp_path, capsys, monkeypatch):
    from procexec.cluster.workflow import Study

    monkeypatch.delenv("PROCEXEC_UNSET_KEY", raising=False)
    overlay = (
        "models:\n  qw-4:\n    backend: openai\n    base_url: http://127.0.0.1:9/v1\n    gpus: 0\n"
        "    api_key_env: PROCEXEC_UNSET_KEY\nrun_models: [qw-4]\n"
    )
    code, out, err = _check_config(tmp_path, capsys, overlay)
    assert code == 2 and len(err) == 1
    with pytest.raises(ProcexecError) as workflow:
        Study.from_config(config_module.read_merged([ROOT / "config.yaml", tmp_path / "overlay.yaml"]))
    assert err[0] == f"procexec check-config: error: {workflow.value}"
    assert "models.qw-4.api_key_env: environment variable PROCEXEC_UNSET_KEY is not set" in err[0]
    monkeypatch.setenv("PROCEXEC_UNSET_KEY", "set")
    code, out, err = _check_config(tmp_path, capsys, overlay)
    assert code == 0 and "valid" in out


@pytest.mark.parametrize(
    "entry, named",
    [
        ("commit: 1234567890123456789012345678901234567890", "models.qw-4.commit: Input should be a valid string"),
        ("commit: " + "a" * 39, "models.qw-4.commit: String should match pattern"),
        ("generation: two", "models.qw-4.generation: Input should be a valid integer"),
        ("generation: -1", "models.qw-4.generation: Input should be greater than or equal to 0"),
        ("generation: 1.5", "models.qw-4.generation: Input should be a valid integer"),
        ("locked_utc: 2026-13-01T00:00:00Z", "models.qw-4.locked_utc: '2026-13-01T00:00:00Z' is not a calendar date"),
        (
            "locked_utc: 2026-01-01T00:00:00Z",
            "models.qw-4.locked_utc: 2026-01-01T00:00:00+00:00 is an unquoted YAML date",
        ),
    ],
)
def test_a_lock_entry_of_the_wrong_type_is_one_line_naming_the_key(entry, named, tmp_path, capsys):
    lock = tmp_path / "models.lock.yaml"
    fields = {
        "hf_id": "Qwen/Qwen3-4B",
        "revision": "main",
        "commit": "'" + "a" * 40 + "'",
        "generation": "0",
        "locked_utc": "'2026-01-01T00:00:00Z'",
    }
    name, value = entry.split(": ", 1)
    fields[name] = value
    lock.write_text("models:\n  qw-4:\n" + "".join(f"    {k}: {v}\n" for k, v in fields.items()))
    hf_id = RAW["models"]["qw-4"]["hf_id"]
    lock.write_text(lock.read_text().replace("Qwen/Qwen3-4B", hf_id))
    code, out, err = _check_config(tmp_path, capsys, f"model_lock: {lock}\nrun_models: [qw-4]\n")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"procexec check-config: error: {lock}: ") and named in err[0], err[0]


_TRICKY_TEXT = st.sampled_from(
    [
        "1e-05",
        "1E5",
        "yes",
        "no",
        "on",
        "off",
        "null",
        "~",
        "2026-01-01",
        "0x1F",
        "0o17",
        "1_000",
        ".nan",
        ".inf",
        "+1",
        "08",
        "true",
        "",
        " ",
        "12:30:00",
        "=",
        "<<",
    ]
)
# Text a person writes in a YAML file: no control characters or the line breaks YAML folds (U+0085, U+2028).
_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=12)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | _TRICKY_TEXT
    | _TEXT
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-05, 1e16, -0.0, 5e-324])
)
_JSONLIKE = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT.filter(bool), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    top_p=st.floats(0, 1, exclude_min=True) | st.sampled_from([1e-05, 0.95]),
    temperature=st.floats(0, 2) | st.just(1e-05),
    checkpoint=st.floats(1e-3, 1e9) | st.just(1e-05),
    date=st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31)),
    kwargs=st.dictionaries(_TEXT.filter(bool), _JSONLIKE, max_size=4),
    extra=_JSONLIKE,
)
def test_the_merged_config_the_jobs_read_equals_what_check_config_validated(
    top_p, temperature, checkpoint, date, kwargs, extra, tmp_path
):
    from procexec.cluster.workflow import merged_config_text

    raw = copy.deepcopy(RAW)
    raw["inference"].update(top_p=top_p, temperature=temperature, template_date=date.isoformat())
    raw["models"]["qw-4"].update(checkpoint_gb=checkpoint, chat_template_kwargs=kwargs, engine_kwargs={"extra": extra})
    source = tmp_path / "config.yaml"
    source.write_text(yaml.safe_dump(raw, allow_unicode=True))
    validated_raw = config_module.read_merged([source])  # what check-config reads ...
    assert validated_raw == raw
    validated = config_module.prepare(validated_raw)  # ... and validates
    merged = tmp_path / "merged.json"
    merged.write_text(merged_config_text(validated_raw))  # what the workflow writes for its jobs
    job_view = config_module.load_merged([merged])  # what every job reads
    assert job_view == validated
    assert json.dumps(plain(job_view), sort_keys=True) == json.dumps(plain(validated), sort_keys=True)  # 1 vs 1.0
    assert isinstance(job_view.inference.top_p, float) and job_view.inference.template_date == date


def test_a_merged_json_config_is_read_as_json_not_as_yaml_1_1(tmp_path):
    raw = copy.deepcopy(RAW)
    raw["inference"]["top_p"] = 1e-05
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(raw))
    assert "1e-05" in path.read_text()
    assert config_module.load_merged([path]).inference.top_p == 1e-05
    path.write_text(json.dumps(raw).replace("1e-05", "NaN"))
    with pytest.raises(ProcexecError, match=r"merged\.json\): inference\.top_p: nan is not a finite number"):
        config_module.load_merged([path])


# ---------------------------------------------------------------- paper cuts (issue 21)


def test_the_packaged_suite_equals_config_yaml_suite():
    """``procexec generate`` outside a checkout reads procexec/data/suite.yaml: it must never drift from config.yaml."""
    assert default_suite() == config_module.read_yaml(ROOT / "config.yaml")["suite"]


def _endpoint_overlay(**fields) -> dict:
    raw = copy.deepcopy(RAW)
    entry = {k: v for k, v in raw["models"]["qw-4"].items() if k not in ("gpus", "tensor_parallel_size")}
    raw["models"]["qw-4"] = {**entry, "backend": "openai", "base_url": "http://127.0.0.1:9/v1", **fields}
    raw["run_models"] = ["qw-4"]
    return raw


def test_an_endpoint_may_leave_out_gpus_and_tensor_parallel_size_and_keeps_its_store_key():
    from procexec.config.keys import output_settings

    bare = config_module.prepare(_endpoint_overlay())
    spelled = config_module.prepare(_endpoint_overlay(gpus=0, tensor_parallel_size=1))
    assert bare.models["qw-4"].gpus == 0 and bare.models["qw-4"].tensor_parallel_size == 1
    assert bare == spelled
    assert output_settings(bare.models["qw-4"], bare.inference) == output_settings(
        spelled.models["qw-4"], spelled.inference
    )  # no rerun of stored generations


@pytest.mark.parametrize(
    "fields, named",
    [
        (
            {"gpus": 2},
            "models.qw-4.gpus: an endpoint model (backend 'openai') holds no GPU of this study (leave gpus out, or 0)",
        ),
        (
            {"tensor_parallel_size": 2},
            "models.qw-4.tensor_parallel_size: an endpoint's parallelism is its server's, "
            "a vllm serve flag (leave it out, or 1)",
        ),
    ],
)
def test_an_endpoint_that_sets_gpus_or_tensor_parallelism_is_refused_in_one_line(fields, named, tmp_path, capsys):
    from procexec.cluster.workflow import Study

    with pytest.raises(ProcexecError) as refused:
        config_module.prepare(_endpoint_overlay(**fields), "config.yaml")
    assert str(refused.value) == f"invalid configuration (config.yaml): {named}"
    # check-config and the workflow agree (the overlay says gpus: 0 over config.yaml's in-process qw-4, gpus 1)
    overlay = {
        "models": {"qw-4": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "gpus": 0, **fields}},
        "run_models": ["qw-4"],
    }
    code, out, err = _check_config(tmp_path, capsys, yaml.safe_dump(overlay))
    with pytest.raises(ProcexecError) as workflow:
        Study.from_config(
            config_module.read_merged([ROOT / "config.yaml", tmp_path / "overlay.yaml"]), "config.yaml + overlay.yaml"
        )
    assert code == 2 and err == [f"procexec check-config: error: {workflow.value}"] and named in err[0]


@pytest.mark.parametrize("backend", ["vllm", "vllm-server"])
def test_an_engine_without_gpus_and_tensor_parallel_size_is_planned_for_the_hardware(backend):
    """Left out, an engine's layout is planned for cluster.hardware (procexec.cluster.layouts); stated, it is
    pinned: a tensor_parallel_size alone takes its engine's GPUs."""
    raw = copy.deepcopy(RAW)
    raw["models"]["qw-4"]["backend"] = backend
    for name in ("gpus", "tensor_parallel_size"):
        raw["models"]["qw-4"].pop(name, None)
    derived = planned(config_module.prepare(copy.deepcopy(raw)))
    assert (derived.models["qw-4"].gpus, derived.models["qw-4"].tensor_parallel_size) == (1, 1)
    assert not derived.plans["qw-4"].pinned and derived.plans["qw-4"].fits
    assert config_module.prepare(copy.deepcopy(raw)).models["qw-4"].gpus is None  # until planned
    raw["models"]["qw-4"]["tensor_parallel_size"] = 2
    pinned = planned(config_module.prepare(raw))
    assert (pinned.models["qw-4"].gpus, pinned.models["qw-4"].tensor_parallel_size) == (2, 2)
    assert pinned.plans["qw-4"].pinned


def test_check_config_and_status_read_several_files_with_the_workflow_s_merge(tmp_path, capsys):
    """check-config (the workflow's verdict) and ``--config A B`` (status, ...) read the same merged config."""
    from procexec.cli.options import load_config
    from procexec.cluster.workflow import Study

    files = [ROOT / "config.yaml", ROOT / "config" / "demo.yaml"]
    code = main_cli(["check-config", *map(str, files)])
    assert code == 0 and "valid (3 datasets, 1 run models)" in capsys.readouterr().out
    merged = load_config([str(f) for f in files])
    assert merged == Study.from_config(config_module.read_merged(files)).config
    assert merged.suite.examples_per_length == 1 and merged.run_models == ["smollm2-135m-instruct"]


def main_cli(argv):
    from procexec.cli import main

    return main(argv)


#: Real lm-eval --log_samples files of the tiny study (tests/data/harness/README.md).
HARNESS_LOGS = ROOT / "tests" / "data" / "harness" / "lm-eval"


def _imported_overlay(**fields) -> dict:
    entry = {"backend": "imported", "abbrev": "IMP", "hf_id": "org/evaluated-elsewhere", **fields}
    return {"models": {"imported": entry}, "run_models": ["qw-4", "imported"]}


@pytest.mark.parametrize(
    "fields, named",
    [
        (
            {"lm_eval": [str(HARNESS_LOGS / "nope-*.jsonl")]},
            f"models.imported.lm_eval.0: '{HARNESS_LOGS}/nope-*.jsonl' matches no log file",
        ),
        ({"inspect": ["missing.eval"]}, "models.imported.inspect.0: 'missing.eval' matches no log file"),
        ({}, "models.imported: backend 'imported' needs the logs of one harness: lm_eval or inspect"),
        (
            {"lm_eval": [str(HARNESS_LOGS / "*.jsonl")], "gpus": 1},
            "models.imported.gpus: an imported model runs nothing here (backend 'imported'); leave it out",
        ),
        (
            {"lm_eval": [str(HARNESS_LOGS / "*.jsonl")], "model_dir": "no/such/folder"},
            "models.imported.model_dir: model directory 'no/such/folder' does not exist",
        ),
        (
            {"inspect": [str(HARNESS_LOGS / "*.jsonl")], "model_dir": str(HARNESS_LOGS)},
            "models.imported.model_dir: only for lm_eval logs (an inspect log names its model folder)",
        ),
        ({"lm_eval": [str(HARNESS_LOGS / "*.jsonl")], "base_url": "http://x"}, "models.imported.base_url: only for"),
    ],
)
def test_an_imported_model_names_existing_logs_of_one_harness_or_is_one_line_exit_2(fields, named, tmp_path, capsys):
    """check-config and the workflow's DAG build refuse it alike, before any job."""
    from procexec.cluster.workflow import Study

    code, _, err = _check_config(tmp_path, capsys, yaml.safe_dump(_imported_overlay(**fields)))
    assert code == 2 and len(err) == 1 and named in err[0], err
    with pytest.raises(ProcexecError) as workflow:
        Study.from_config(config_module.read_merged([ROOT / "config.yaml", tmp_path / "overlay.yaml"]))
    assert named in str(workflow.value)


def test_an_imported_model_moves_no_other_models_key_and_runs_nothing_here(tmp_path):
    from procexec.config.keys import output_settings

    plain_raw = copy.deepcopy(RAW)
    with_imported = config_module.deep_merge(RAW, _imported_overlay(lm_eval=[str(HARNESS_LOGS / "*.jsonl")]))
    config = config_module.prepare(with_imported)
    entry = config.models["imported"]
    assert (entry.holds_gpus, entry.stages_weights, entry.runs_in_job, entry.serves_over_http) == (False,) * 4
    assert not entry.generates_here and entry.model_dir is None and entry.harness == "lm-eval"
    assert entry.gpus == 0
    qw = output_settings(config.models["qw-4"], config.inference)
    assert qw == output_settings(config_module.prepare(plain_raw).models["qw-4"], config.inference)
    assert "lm_eval" not in qw["model"]  # keyed when set: the study's models never state it
    assert output_settings(entry, config.inference)["model"]["lm_eval"] == [str(HARNESS_LOGS / "*.jsonl")]
    checked = config_module.deep_merge(with_imported, {"models": {"imported": {"model_dir": str(HARNESS_LOGS)}}})
    with pytest.raises(ProcexecError, match=r"models\.imported\.lm_eval\.0: .* has no lm-eval results file beside"):
        config_module.prepare(checked)  # the prompt check reads each run's max_length there
    date = "2026-08-22T10-11-12.123456"
    for log in HARNESS_LOGS.glob("*.jsonl"):  # as lm-eval names a run's files
        (tmp_path / f"{log.stem}_{date}.jsonl").write_bytes(log.read_bytes())
    (tmp_path / f"results_{date}.json").write_text('{"config": {"model_args": "max_length=40000"}}')
    run = {"models": {"imported": {"model_dir": str(HARNESS_LOGS), "lm_eval": [str(tmp_path / "*.jsonl")]}}}
    checked = config_module.deep_merge(with_imported, run)
    assert config_module.prepare(checked).models["imported"].model_dir == str(HARNESS_LOGS)  # the prompt check runs


def test_a_harness_field_on_a_model_that_runs_here_names_the_backend_it_belongs_to(tmp_path, capsys):
    code, _, err = _check_config(tmp_path, capsys, yaml.safe_dump({"models": {"qw-4": {"lm_eval": ["x.jsonl"]}}}))
    assert code == 2 and err[0].endswith("models.qw-4.lm_eval: only for backend 'imported'"), err


def test_a_shard_count_no_workflow_can_hold_is_refused_in_one_line(tmp_path, capsys):
    """10**30 shards of a run model passed check-config, then the DAG build ran out of memory (24 GB here,
    found by tests/cli/test_fuzz_inputs.py's dry runs): the count is capped where it enters."""
    code, out, err = _check_config(tmp_path, capsys, "models:\n  qw-4:\n    shards: 1000000000000000000000000000000\n")
    assert code == 2 and len(err) == 1 and "models.qw-4.shards: Input should be less than or equal to 1024" in err[0]
    code, out, err = _check_config(tmp_path, capsys, "models:\n  qw-4:\n    shards: 1024\n")
    assert code == 0, err


def test_check_config_reads_an_overlay_as_snakemake_reads_it(tmp_path, capsys):
    """Issue 38.4: Snakemake reads a config file as JSON first, whatever its name (snakemake/common/
    configfile.py): a JSON overlay's 1e3 is 1000.0 to the workflow, and check-config refused it as the text '1e3'
    (YAML 1.1).  A repeated key is refused in JSON as in YAML; a YAML file named .json is YAML to both."""
    code, out, err = _check_config(tmp_path, capsys, '{"inference": {"stall_timeout_s": 1e3}}')
    assert code == 0 and err == [], err
    assert config_module.read_yaml(tmp_path / "overlay.yaml") == {"inference": {"stall_timeout_s": 1000.0}}
    yaml_as_json = tmp_path / "overlay.json"
    yaml_as_json.write_text("inference:\n  stall_timeout_s: 1200\n")
    assert config_module.read_yaml(yaml_as_json) == {"inference": {"stall_timeout_s": 1200}}
    code, out, err = _check_config(tmp_path, capsys, '{"inference": {"top_p": 0.5, "top_p": 0.9}}')
    assert code == 2 and err[0].endswith("overlay.yaml: not valid JSON (key 'top_p' appears twice in one object)")
    broken = tmp_path / "broken.json"
    broken.write_text('{"inference": {"top_p": }')
    with pytest.raises(ProcexecError, match=r"broken\.json:1: not valid JSON \(Expecting value\)"):
        config_module.read_yaml(broken)


def test_check_config_refuses_what_the_workflow_refuses_before_any_job(tmp_path, capsys):
    """Issue 38.4: cluster.node_mem_gb below a generation job's need stopped `snakemake -n` in one line while
    check-config said valid: check-config runs the workflow's own start checks (Study.check_start)."""
    from procexec.cluster.workflow import Study

    code, out, err = _check_config(tmp_path, capsys, "cluster:\n  node_mem_gb: 16\n")
    study = Study.from_config(config_module.read_merged([ROOT / "config.yaml", tmp_path / "overlay.yaml"]))
    refusal = study.host_memory_refusal()
    assert refusal is not None and "cluster.node_mem_gb 16" in refusal
    assert code == 2 and err == [f"procexec check-config: error: config.yaml + overlay.yaml: {refusal}"], err


@pytest.mark.parametrize(
    ("overlay", "named"),
    [
        (
            "inference:\n  stall_timeout_s: 1.0e-9\n",
            "inference.stall_timeout_s: Input should be greater than or equal to 60",
        ),
        (
            "inference:\n  stall_timeout_s: 59\n",
            "inference.stall_timeout_s: Input should be greater than or equal to 60",
        ),
        (
            "models:\n  ds-685:\n    server_start_timeout_s: 5\n",
            "models.ds-685.server_start_timeout_s: Input should be greater than or equal to 60",
        ),
        (
            "models:\n  ds-685:\n    request_timeout_s: 0.001\n",
            "models.ds-685.request_timeout_s: Input should be greater",
        ),
        ("cluster:\n  cache_dir: ~no-such-user-38/caches\n", "cluster.cache_dir: no such home folder here to expand"),
    ],
)
def test_a_duration_no_watchdog_can_use_or_a_home_no_shell_knows_is_refused(overlay, named, tmp_path, capsys):
    """Issue 38.5: stall_timeout_s 1.0e-9 passed (a watchdog that fires at once)."""
    code, out, err = _check_config(tmp_path, capsys, overlay)
    assert code == 2 and len(err) == 1 and named in err[0], err


def test_a_path_with_a_tilde_is_the_home_folder_s(tmp_path, monkeypatch):
    """cluster.cache_dir: ~/caches passed, and the job made a folder named '~' in its working folder: every path
    of the config is expanded as a shell expands it, where it is read."""
    from procexec.generation.job_settings import JobSettings

    monkeypatch.setenv("HOME", str(tmp_path))
    raw = config_module.deep_merge(RAW, {"cluster": {"cache_dir": "~/caches"}, "model_lock": "~/models.lock.yaml"})
    raw["models"]["qw-4"].update(source="path", path="~/qw-4")
    (tmp_path / "qw-4").mkdir()
    config = config_module.prepare(raw)
    assert config.cluster.cache_dir == f"{tmp_path}/caches" and config.model_lock == f"{tmp_path}/models.lock.yaml"
    assert config.models["qw-4"].path == f"{tmp_path}/qw-4"  # found: the check that it is a folder passed
    assert JobSettings.from_config(config, "qw-4").cache_dir == f"{tmp_path}/caches"

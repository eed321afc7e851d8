"""Config validation: bad keys are named, before anything runs."""

import copy
from pathlib import Path

import pytest
import yaml

from procexec import config as config_module
from procexec.errors import ProcexecError

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "config.yaml").read_text())


def test_paper_config_is_valid_and_has_15_models():
    config = config_module.load(ROOT / "config.yaml")
    assert len(config["run_models"]) == 15
    assert config["models"]["qw-14"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert config["models"]["ds-685"]["tensor_parallel_size"] == 8


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
        (lambda c: c["models"]["ds-685"].__setitem__("gpus", 4), "models.ds-685.tensor_parallel_size: 8 is larger than gpus (4)"),
        (lambda c: c["models"]["qw-4"].update(source="path", path="/nonexistent/model"), "does not exist"),
        (lambda c: c["suite"].__setitem__("datasets", ["add_int_1-10_k9"]), "suite.datasets: unknown dataset id"),
    ],
)
def test_bad_config_names_the_key(mutate, named):
    with pytest.raises(ProcexecError) as info:
        config_module.prepare(_broken(mutate), "config.yaml")
    assert named in str(info.value)


def test_dataset_subset_narrows_the_suite():
    suite = copy.deepcopy(RAW["suite"])
    suite["datasets"] = ["add_int_1-10_k1", "mixed_float_0-1_k7"]
    assert [s.id for s in config_module.expand_suite(suite)] == ["add_int_1-10_k1", "mixed_float_0-1_k7"]


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
    abbrevs = {m["abbrev"] for k, m in config["models"].items() if k not in examples}
    for key in examples:
        assert config["models"][key]["backend"] == "openai" and config["models"][key]["abbrev"] in abbrevs
    monkeypatch.delenv("PROCEXEC_DS685_KEY", raising=False)
    with pytest.raises(ProcexecError, match="models.ds-685-endpoint.api_key_env: environment variable PROCEXEC_DS685_KEY"):
        check_endpoint_keys(config)

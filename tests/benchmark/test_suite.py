"""The generator: suite ids from config, determinism, the operand-window rule."""

import hashlib
import json
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procexec import config as config_module
from procexec.benchmark.procedure import parse, render
from procexec.benchmark.suite import DatasetSpec, expand_suite, generate_dataset, generate_example
from procexec.errors import ProcexecError
from procexec.io.jsonl import dumps
from procexec.records import DATASET_ID, INPUT_TYPES, OPERATOR_SYMBOLS, OPERATORS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = config_module.load(ROOT / "config.yaml")
SPECS = expand_suite(CONFIG.suite)
PARAMS = CONFIG.suite


def _digest(examples) -> str:
    return hashlib.sha256("".join(dumps(e.to_json()) + "\n" for e in examples).encode()).hexdigest()


def test_paper_suite_has_55_datasets_with_stable_ids():
    ids = [s.id for s in SPECS]
    assert len(ids) == len(set(ids)) == 55
    assert sum(s.lookback == 1 for s in SPECS) == 25
    assert {"add_int_1-10_k1", "mixed_float_10-100_k5", "div_float_0-1_k1", "mixed_int_10-100_k7"} <= set(ids)
    assert not any(s.lookback > 1 and s.operator != "mixed" for s in SPECS)
    assert all(DatasetSpec.from_id(i).id == i for i in ids)


def test_every_suite_dataset_has_1000_examples_with_unique_ids():
    all_ids = set()
    for spec in SPECS:
        examples = generate_dataset(spec, PARAMS.lengths, PARAMS.examples_per_length, PARAMS.seed)
        assert len(examples) == 1000
        assert {e.length for e in examples} == set(range(5, 96, 10))
        all_ids.update(e.id for e in examples)
    assert len(all_ids) == 55_000


def test_same_bytes_in_any_order():
    spec = DatasetSpec.from_id("mixed_float_1-10_k3")
    forward = [generate_example(spec, n, i, 7) for n in (5, 45) for i in range(20)]
    backward = [generate_example(spec, n, i, 7) for n in (45, 5) for i in reversed(range(20))]
    assert _digest(forward) == _digest(sorted(backward, key=lambda e: (e.length, e.index)))


def _dataset_digest(dataset_id: str) -> str:
    return _digest(generate_dataset(DatasetSpec.from_id(dataset_id), (5, 95), 30, 11))


def test_same_bytes_with_any_number_of_processes_and_in_a_fresh_interpreter():
    ids = ["mul_int_10-100_k1", "mixed_float_0-1_k7", "div_int_1-10_k1"]
    serial = [_dataset_digest(i) for i in ids]
    with ProcessPoolExecutor(2) as pool:
        parallel = list(pool.map(_dataset_digest, ids))
    code = (
        "from procexec.benchmark.suite import DatasetSpec, generate_dataset;"
        "import hashlib; from procexec.io.jsonl import dumps;"
        "print(hashlib.sha256(''.join(dumps(e.to_json())+'\\n' for e in "
        "generate_dataset(DatasetSpec.from_id('mul_int_10-100_k1'), (5, 95), 30, 11)).encode()).hexdigest())"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert serial == parallel
    assert fresh == serial[0]


def test_seed_changes_the_data():
    spec = DatasetSpec.from_id("add_int_1-10_k1")
    assert generate_example(spec, 15, 0, 1).procedure != generate_example(spec, 15, 0, 2).procedure


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 7),
    operator=st.sampled_from(OPERATORS),
    length=st.integers(1, 60),
    index=st.integers(0, 10_000),
    seed=st.integers(0, 2**32),
)
def test_operands_lie_in_the_lookback_window(k, operator, length, index, seed):
    spec = DatasetSpec.from_id(f"{operator}_int_1-10_k{k}")
    example = generate_example(spec, length, index, seed)
    steps = parse(example.procedure)
    assert render(steps) == example.procedure  # generator writes exactly the grammar's text
    assert len(steps) == length
    for step in steps:
        t = step.target
        if k == 1:
            # S_{t-1} and one input other than S_{t-1} itself
            assert t - 1 in (step.left, step.right)
            other = step.right if step.left == t - 1 else step.left
            assert other in (1, 2) and other != t - 1
        else:
            window = range(max(1, t - k), t)
            assert step.left in window and step.right in window and step.left != step.right
        if operator != "mixed":
            assert step.op == {"add": "+", "sub": "-", "mul": "*", "div": "/"}[operator]


@settings(max_examples=40, deadline=None)
@given(
    setting=st.sampled_from(["int_1-10", "int_10-100", "float_0-1", "float_1-10", "float_10-100"]),
    index=st.integers(0, 10**6),
)
def test_inputs_follow_the_spec_table(setting, index):
    example = generate_example(DatasetSpec.from_id(f"add_{setting}_k1"), 5, index, 3)
    low, high = map(int, setting.split("_")[1].split("-"))
    for value in (example.x, example.y):
        assert low <= value <= high
        if setting.startswith("int"):
            assert type(value) is int
        else:
            assert type(value) is float and round(value, 3) == value


def test_the_window_reaches_back_k_steps_somewhere():
    """k really widens the window (not just k = 2 everywhere)."""
    examples = generate_dataset(DatasetSpec.from_id("mixed_int_1-10_k7"), (95,), 5, 0)
    gaps = {step.target - min(step.left, step.right) for e in examples for step in parse(e.procedure)}
    assert max(gaps) == 7


@pytest.mark.parametrize("bad", ["add_int_1-10", "pow_int_1-10_k1", "add_int_10-1_k1", "add_int_1-10_k0", ""])
def test_bad_dataset_ids_are_refused(bad):
    with pytest.raises(ProcexecError, match="dataset id"):
        DatasetSpec.from_id(bad)


def test_procedure_text_has_no_trailing_spaces_and_spec_operators():
    example = generate_example(DatasetSpec.from_id("mixed_int_1-10_k2"), 95, 0, 0)
    assert all(line == line.rstrip() for line in example.procedure.split("\n"))
    assert re.search(r"S\d+ [-+*/] S\d+", example.procedure)
    assert json.loads(dumps(example.to_json()))["procedure"] == example.procedure


def _enums(node, key=None):
    """(property name, enum) of every enum in a JSON schema, an array's items under the array's name."""
    if isinstance(node, dict):
        if "enum" in node:
            yield key, node["enum"]
        for name, child in node.items():
            yield from _enums(child, key if name in ("items", "properties") else name)
    elif isinstance(node, list):
        for child in node:
            yield from _enums(child, key)


@pytest.mark.parametrize("schema", ["config.schema.json", "paper_numbers.schema.json"])
def test_the_schemas_name_the_operators_of_the_vocabulary(schema):
    """The JSON schemas cannot import procexec.records: their operator enums must equal its vocabulary."""
    enums = list(_enums(json.loads((ROOT / "src" / "procexec" / "schemas" / schema).read_text())))
    operators = [values for name, values in enums if name in ("operators", "operator")]
    assert operators and all(values == list(OPERATORS) for values in operators)
    types = [values for name, values in enums if name == "type"]
    assert all(values == list(INPUT_TYPES) for values in types)


def test_the_vocabulary_is_the_spec_s():
    """The paper's five task variants and the procedure symbols of the four fixed ones (spec section 1)."""
    assert OPERATORS == ("add", "sub", "mul", "div", "mixed")
    assert OPERATOR_SYMBOLS == {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    assert all(DATASET_ID.fullmatch(f"{op}_int_1-10_k1") for op in OPERATORS)

"""Per-example scores on hand-written outputs, hostile text, and the score command's file handling."""

import gzip
import json
import math
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procexec.benchmark.executor import execute
from procexec.benchmark.procedure import Step, render
from procexec.cli import main
from procexec.records import Example, GenerationRecord
from procexec.scoring.score import SCORE_COLUMNS, log10_abs, score_example
from procexec.scoring.simulator import synthetic_token_offsets

DOCS = Path(__file__).resolve().parents[2] / "docs" / "interfaces.md"


def example(steps, x, y, input_type="int", index=0):
    procedure = render([Step(t, a, op, b) for t, a, op, b in steps])
    return Example(
        id=f"mixed_{input_type}_1-10_k2:{len(steps)}:{index}", dataset=f"mixed_{input_type}_1-10_k2", length=len(steps),
        index=index, x=x, y=y, procedure=procedure, input_type=input_type, input_range="1-10", operator="mixed",
        lookback=2, seed=0, spec_version="1",
    )  # fmt: skip


# x=5, y=8: S3 = 13, S4 = 104, S5 = 13.0 (104 / 8), S6 = 5.0, S7 = 40.0 -- the paper's prompt example
PAPER = example([(3, 1, "+", 2), (4, 2, "*", 3), (5, 4, "/", 2), (6, 5, "-", 2), (7, 2, "*", 6)], 5, 8)
STEPS = (
    "Step 1: S3 = S1 + S2 = 5 + 8 = 13\nStep 2: S4 = S2 * S3 = 8 * 13 = 104\n"
    "Step 3: S5 = S4 / S2 = 104 / 8 = 13.0\nStep 4: S6 = S5 - S2 = 13.0 - 8 = 5.0\nStep 5: S7 = S2 * S6 = 8 * 5.0 = 40.0\n"
)


def score(text, ex=PAPER, finish_reason="stop", offsets=None, attempt=1):
    gen = GenerationRecord(
        id=ex.id, model="m", dataset=ex.dataset, length=ex.length, index=ex.index, attempt=attempt, text=text,
        num_generated_tokens=len(offsets) if offsets else max(1, len(text) // 4), finish_reason=finish_reason,
        token_offsets=offsets,
    )  # fmt: skip
    return score_example(gen, execute(ex), ex)


def test_columns_are_the_contract():
    block = DOCS.read_text().split("## Per-example score columns")[1].split("`")[3]
    names = [part.strip() for part in re.sub(r"\([^)]*\)", "", block).split(",")]
    assert list(SCORE_COLUMNS) == names
    assert list(score(STEPS + "<answer>40</answer>")) == list(SCORE_COLUMNS)


def test_faithful_output():
    row = score(STEPS + "<answer>40</answer>")
    assert row["faa"] and row["caa"] and row["parseable"] and row["tolerance_match"]
    assert row["steps_generated"] == 5 and row["step_following"] == "exact"
    assert row["first_divergent_step"] is None and row["correct_prefix"] == 5 and row["n_claims"] == 5
    assert row["answer_matches_last_claim"] is True and row["first_answer_value"] == "40"
    assert row["expected"] == "40.0" and row["expected_float"] == 40.0


def test_the_row_carries_the_divergent_claim_and_its_span():
    """What the report shows of the divergence comes from the row: the claimed value and where it is written."""
    text = STEPS.replace("= 104\n", "= 105\n", 1) + "<answer>40</answer>"
    row = score(text)
    assert row["first_divergent_step"] == 2 and row["first_error_class"] == "arithmetic_slip"
    assert row["divergent_claim"] == "105"
    start, end = row["divergent_claim_start"], row["divergent_claim_end"]
    assert text[start:end] == "S4 =" and start == text.index("S4 = S2")
    for right in (STEPS, ""):  # no divergence; a skipped step (no claim)
        row = score(right)
        assert row["divergent_claim"] is row["divergent_claim_start"] is row["divergent_claim_end"] is None


def test_first_wrong_later_right():
    row = score(STEPS + "<answer>41</answer> wait, recheck <answer>40.0</answer> <answer>40</answer>")
    assert not row["faa"] and row["caa"] and row["n_answers"] == 3 and row["n_parseable"] == 3
    assert row["first_answer_raw"] == "41" and not row["tolerance_match"]


def test_unparseable_first_answer_is_wrong_and_ap_uses_first_parseable():
    text = "<answer>forty</answer>" + "x" * 78 + "<answer>40</answer>"
    row = score(text)
    assert not row["faa"] and row["caa"] and row["parseable"] and row["n_parseable"] == 1
    assert row["first_answer_value"] is None and row["first_answer_raw"] == "forty"
    assert row["answer_position_basis"] == "chars" and row["answer_position"] == pytest.approx(100 * 100 / len(text))


def test_unclosed_tag_and_empty_output():
    for text in ("<answer>40", ""):
        row = score(text)
        assert not row["faa"] and not row["caa"] and not row["parseable"] and row["n_answers"] == 0
        assert row["answer_position"] is None and row["answer_position_basis"] is None
        assert row["steps_generated"] == 0 and row["step_following"] == "under"
        assert row["first_divergent_step"] == 1 and row["n_skipped"] == 5 and row["first_error_class"] == "skipped"
        assert row["answer_matches_last_claim"] is None


def test_answer_only_inside_think_block_counts():
    row = score("<think>" + STEPS + "<answer>40</answer></think>\nDone.")
    assert row["faa"] and row["parseable"]


def test_boxed_answer():
    assert score(STEPS + "<answer>$\\boxed{40}$</answer>")["faa"]


def test_thousands_and_exponent_answers():
    big = example([(3, 1, "*", 2)], 1.5, 823.0, input_type="float")  # 1234.5
    assert score("<answer>1,234.5</answer>", big)["faa"]
    exp = example([(3, 1, "*", 2)], 300, 400)  # 120000
    row = score("<answer>1.2E+05</answer>", exp)
    assert row["faa"] and row["first_answer_value"] == "120000.0"


def test_infinite_and_nan_references():
    neg_inf = example([(3, 1, "/", 2)], -1.5, 0.0, input_type="float")
    assert score("<answer>-inf</answer>", neg_inf)["faa"]
    assert not score("<answer>inf</answer>", neg_inf)["faa"]
    row = score("<answer>-Infinity</answer>", neg_inf)
    assert row["faa"] and math.isnan(row["expected_float"]) and row["expected_log10_abs"] == math.inf
    nan = example([(3, 1, "/", 2)], 0.0, 0.0, input_type="float")
    assert score("<answer>NaN</answer>", nan)["faa"] and not score("<answer>0</answer>", nan)["faa"]


def test_190_digit_integer_reference_is_exact():
    steps = [(3, 1, "*", 2)] + [(t, t - 1, "*", 2) for t in range(4, 98)]
    ex = example(steps, 99, 99)  # 99 ** 96: 192 digits
    exact = 99**96
    assert score(f"<answer>{exact}</answer>", ex)["faa"]
    near = score(f"<answer>{exact + 1}</answer>", ex)
    assert not near["faa"] and near["tolerance_match"]
    floaty = score(f"<answer>{float(exact)!r}</answer>", ex)
    assert not floaty["faa"] and floaty["tolerance_match"]
    assert score("", ex)["expected_log10_abs"] == pytest.approx(96 * math.log10(99))


def test_step_markers_repeated_and_missing():
    repeated = STEPS + STEPS.replace("Step", "Step ") + "Step 05: again\n"
    assert score(repeated)["steps_generated"] == 5
    missing = "\n".join(line for line in STEPS.splitlines() if not line.startswith(("Step 2", "Step 4")))
    row = score(missing + "<answer>40</answer>")
    assert row["steps_generated"] == 3 and row["step_following"] == "under"
    over = score(STEPS + "Step 6: done\nStep 7: really\n")
    assert over["steps_generated"] == 7 and over["step_following"] == "over"
    assert score("Substep 9 and FirstStep 3")["steps_generated"] == 0


def test_answer_position_in_tokens():
    text = STEPS + "<answer>40</answer>"
    offsets = synthetic_token_offsets(text)
    row = score(text, offsets=offsets)
    token = max(i for i, o in enumerate(offsets) if o <= text.index("<answer>"))
    assert row["answer_position_basis"] == "tokens"
    assert row["answer_position"] == pytest.approx(100 * token / len(offsets))


def test_truncation_flag():
    row = score(STEPS[:50], finish_reason="length")
    assert row["truncated"] and row["finish_reason"] == "length" and not row["parseable"]


def test_log10_abs():
    assert log10_abs(0) == -math.inf and math.isnan(log10_abs(math.nan)) and log10_abs(10**300) == 300
    assert log10_abs(-0.001) == pytest.approx(-3)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("S0123456789 =+-*/.,;\n<>answer/Step{}\\boxed$e")), max_size=400))
def test_arbitrary_text_scores_without_raising(text):
    row = score(text)
    assert 0 <= row["correct_prefix"] <= 5 and row["n_claims"] <= 5


def test_hostile_megabyte_scores_fast():
    text = ("<answer>" * 100_000 + "S3 = " + "9" * 100_000 + "\nStep " + "1" * 100_000 + " S4 =" * 20_000
            + "S5 = 1, " * 10_000 + "<answer>" + "1," * 50_000 + "</answer>")  # fmt: skip
    assert len(text) > 1_000_000
    started = time.process_time()
    row = score(text)
    assert time.process_time() - started < 1.0  # CPU time: other jobs on the machine do not count
    assert row["n_answers"] == 1 and not row["parseable"]


# --- the score command -------------------------------------------------------


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def files(tmp_path):
    ex = [example([(3, 1, "+", 2)], 5, i, index=i) for i in range(3)]
    (tmp_path / "datasets").mkdir()
    (tmp_path / "references").mkdir()
    dataset = tmp_path / "datasets" / "d.jsonl"
    refs = tmp_path / "references" / "d.jsonl"
    _write(dataset, [e.to_json() for e in ex])
    _write(refs, [execute(e).to_json() for e in ex])

    def gen(e, text, attempt=1):
        return GenerationRecord(
            id=e.id, model="m", dataset=e.dataset, length=e.length, index=e.index, attempt=attempt, text=text,
            num_generated_tokens=3, finish_reason="length" if attempt == 1 else "stop",
        ).to_json()  # fmt: skip

    gens = [gen(e, f"<answer>{5 + e.y}</answer>") for e in ex]
    return tmp_path, ex, dataset, refs, gens, gen


def test_score_command_highest_attempt_and_gz(files):
    tmp, ex, dataset, refs, gens, gen = files
    path = tmp / "g.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        for row in [gen(ex[0], "<answer>0</answer>"), gens[1], gens[2], gen(ex[0], "<answer>5</answer>", attempt=2)]:
            handle.write(json.dumps(row) + "\n")
    out = tmp / "s" / "scores.parquet"
    assert (
        main(
            [
                "score",
                "--generations",
                str(path),
                "--references",
                str(refs),
                "--dataset",
                str(dataset),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = pq.read_table(out).to_pylist()
    assert [r["id"] for r in table] == [e.id for e in ex]
    assert table[0]["attempt"] == 2 and table[0]["faa"] and not table[0]["truncated"]


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda lines: lines[:1] + ['{"id": "x", broken\n'] + lines[2:], r"g\.jsonl:2: not valid JSON"),
        (lambda lines: lines[:2] + [lines[2].replace(":1:2", ":1:9").replace('"index": 2', '"index": 9')],
         r"g\.jsonl:3: id .* is not in the references"),
        (lambda lines: lines[:2], r"d\.jsonl:3: no generation for id"),
        (lambda lines: lines + lines[:1], r"g\.jsonl:4: attempt 1 of .* already on line 1"),
        (lambda lines: lines[:1] + [lines[1].replace('"num_generated_tokens": 3', '"num_generated_tokens": "3"')] + lines[2:],
         r"g\.jsonl:2: field 'num_generated_tokens'"),
    ],
)  # fmt: skip
def test_bad_input_names_file_and_line_and_writes_nothing(files, capsys, corrupt, message):
    tmp, ex, dataset, refs, gens, gen = files
    lines = [json.dumps(g) + "\n" for g in gens]
    (tmp / "g.jsonl").write_text("".join(corrupt(lines)))
    out = tmp / "out" / "s.parquet"
    assert (
        main(
            [
                "score",
                "--generations",
                str(tmp / "g.jsonl"),
                "--references",
                str(refs),
                "--dataset",
                str(dataset),
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() and not any(out.parent.glob("*")) if out.parent.exists() else True


def test_missing_dataset_is_an_error(files, capsys):
    tmp, ex, dataset, refs, gens, gen = files
    _write(tmp / "g.jsonl", gens)
    dataset.unlink()
    assert (
        main(
            [
                "score",
                "--generations",
                str(tmp / "g.jsonl"),
                "--references",
                str(refs),
                "--dataset",
                str(dataset),
                "--out",
                str(tmp / "o.parquet"),
            ]
        )
        == 2
    )
    assert f"{dataset}: file not found" in capsys.readouterr().err


def test_a_score_file_of_an_older_column_set_is_refused_naming_the_columns(files):
    """The column list is the score files' version: a file scored before the divergent claim's columns is
    refused by name, not read with the report's columns missing."""
    from procexec.errors import ProcexecError
    from procexec.scoring.files import read_scores

    tmp, ex, dataset, refs, gens, gen = files
    _write(tmp / "g.jsonl", gens)
    out = tmp / "s.parquet"
    assert (
        main(
            [
                "score",
                "--generations",
                str(tmp / "g.jsonl"),
                "--references",
                str(refs),
                "--dataset",
                str(dataset),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert read_scores([str(out)]).num_rows == 3
    old = tmp / "old.parquet"
    pq.write_table(
        pq.read_table(out).drop_columns(["divergent_claim", "divergent_claim_start", "divergent_claim_end"]), old
    )
    with pytest.raises(
        ProcexecError,
        match=r"old\.parquet: columns differ .*\(missing divergent_claim, "
        r"divergent_claim_start, divergent_claim_end; .* score it again\)",
    ):
        read_scores([str(old)])

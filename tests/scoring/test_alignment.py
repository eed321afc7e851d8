"""Trace alignment on hand-written traces, and recovery of the simulator's injected failures."""

from collections import Counter

from procexec.benchmark.executor import execute
from procexec.benchmark.procedure import parse_rows
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.scoring.alignment import align, parse_claims
from procexec.scoring.simulator import ALIGNMENT_CLASS, simulate

# The paper's prompt example, x=5, y=8: S3 = 13, S4 = 104, S5 = 13.0, S6 = 5.0, S7 = 40.0
PROCEDURE = (
    "function(x, y):\nLet S1 = x\nLet S2 = y\nStep 1: S3 = S1 + S2\nStep 2: S4 = S2 * S3\n"
    "Step 3: S5 = S4 / S2\nStep 4: S6 = S5 - S2\nStep 5: S7 = S2 * S6\nFinal Step: Return S7"
)
ROWS = parse_rows(PROCEDURE)
TRACE = ["5", "8", "13", "104", "13.0", "5.0", "40.0"]


def run(text):
    return align(text, ROWS, TRACE)


def test_claim_forms():
    claims = parse_claims("S3 = S1 + S2 = 5 + 8 = 13\nS_4 = 104, S_{5} = 13.0; S6 = (-3) - 8 = -11. Then S7 == 2\n", 7)
    assert {v: c.value for v, c in claims.items()} == {3: 13, 4: 104, 5: 13.0, 6: -11}
    assert claims[3].token == "13"


def test_restated_procedure_is_not_a_claim_and_first_valued_claim_wins():
    claims = parse_claims("Step 1: S3 = S1 + S2\nso S3 = 13\nlater S3 = 14", 7)
    assert claims[3].value == 13


def test_correct_trace():
    al = run("S3 = 13\nS4 = 8 * 13 = 104\nS5 = 13\nS6 = 5\nS7 = 40")
    assert al.first_divergent_step is None and al.correct_prefix == 5 and al.n_claims == 5
    assert al.last_claim == 40


def test_arithmetic_slip_then_propagation():
    al = run("S3 = 5 + 8 = 14\nS4 = 8 * 14 = 112\nS5 = 112 / 8 = 14.0\nS6 = 14.0 - 8 = 6.0\nS7 = 8 * 6.0 = 48.0")
    assert al.first_divergent_step == 1 and al.correct_prefix == 0
    assert al.classes == ("arithmetic_slip", "propagation", "propagation", "propagation", "propagation")
    assert al.first_error_class == "arithmetic_slip" and al.count("propagation") == 4


def test_wrong_operand_written_and_unwritten():
    written = run("S3 = 13\nS4 = S2 * S3 = 8 * 5 = 40\n")  # S1's value used for S3
    assert written.classes[1] == "wrong_operand" and written.first_divergent_step == 2
    unwritten = run("S3 = 13\nS4 = 65\n")  # 5 * 13: S1 instead of S2, no operands written
    assert unwritten.classes[1] == "wrong_operand"
    slip = run("S3 = 13\nS4 = 103\n")
    assert slip.classes[1] == "arithmetic_slip"


def test_commuted_operands_are_right_for_commutative_ops():
    assert run("S3 = 13\nS4 = 13 * 8 = 105").classes[1] == "arithmetic_slip"


def test_skipped_step():
    al = run("S3 = 13\nS5 = 13.0\nS6 = 5.0\nS7 = 40.0")
    assert al.first_divergent_step == 2 and al.correct_prefix == 1 and al.classes[1] == "skipped"
    assert al.count("skipped") == 1 and al.classes[2:] == (None, None, None)
    assert al.divergent_claim is None  # a skipped step has no claim to point at


def test_the_divergent_claim_is_the_first_wrong_one_with_its_span():
    text = "S3 = 13\nS4 = 8 * 13 = 103\nS5 = 103 / 8 = 12.875\n"
    claim = run(text).divergent_claim
    assert (claim.var, claim.token) == (4, "103")
    assert text[claim.start : claim.end] == "S4 =" and claim.start == text.index("S4")
    assert run("S3 = 13\nS4 = 104\nS5 = 13.0\nS6 = 5.0\nS7 = 40.0").divergent_claim is None


def test_rounded_claims_agree():
    procedure = "function(x, y):\nLet S1 = x\nLet S2 = y\nStep 1: S3 = S1 / S2\nFinal Step: Return S3"
    al = align("S3 = 0.3333", parse_rows(procedure), ["1", "3", "0.3333333333333333"])
    assert al.first_divergent_step is None


def test_simulator_failures_are_recovered():
    specs = ["mixed_float_10-100_k3", "mul_int_1-10_k1", "div_float_0-1_k1", "sub_int_10-100_k1", "mixed_int_1-10_k7"]
    misses, total, classes = [], 0, Counter()
    for dataset in specs:
        for ex in generate_dataset(
            DatasetSpec.from_id(dataset), lengths=(5, 25, 55, 95), examples_per_length=25, seed=3
        ):
            gen = simulate(ex, execute(ex), seed=0, failure_rate=0.8, target_chars=2000)
            label = gen.provenance["simulated_failure"]
            al = align(gen.text, parse_rows(ex.procedure), execute(ex).trace)
            total += 1
            classes[label["class"]] += 1
            if (al.first_error_class, al.first_divergent_step) != (ALIGNMENT_CLASS.get(label["class"]), label["step"]):
                misses.append((ex.id, label, al.first_error_class, al.first_divergent_step))
    assert total == 500 and min(classes.values()) >= 30, classes
    assert len(misses) <= total // 100, misses[:5]

"""Prompts: the paper's Figure 7 reproduced byte for byte."""

from pathlib import Path

from procexec.benchmark.prompts import SYSTEM_PROMPT, chat_messages, format_input, user_message
from procexec.records import Example

GOLDEN = Path(__file__).parents[1] / "golden"
FIGURE7_PROCEDURE = (
    "function(x, y):\nLet S1 = x\nLet S2 = y\nStep 1: S3 = S1 + S2\nStep 2: S4 = S2 * S3\n"
    "Step 3: S5 = S4 / S2\nStep 4: S6 = S5 - S2\nStep 5: S7 = S2 * S6\nFinal Step: Return S7"
)
FIGURE7 = Example(
    id="figure7",
    dataset="mixed_int_1-10_k1",
    length=5,
    index=0,
    x=5,
    y=8,
    procedure=FIGURE7_PROCEDURE,
    input_type="int",
    input_range="1-10",
    operator="mixed",
    lookback=1,
    seed=0,
    spec_version="1.0",
)


def test_figure7_prompt_byte_for_byte():
    """Golden file = system message, a blank line, user message (as a transcript)."""
    system, user = chat_messages(FIGURE7)
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    rendered = (system["content"] + "\n\n" + user["content"] + "\n").encode("utf-8")
    assert rendered == (GOLDEN / "figure7_prompt.txt").read_bytes()


def test_golden_matches_the_papers_printed_figure7():
    """The paper's text extraction doubles every newline, curls quotes and escapes '/'.

    Undoing exactly those three artefacts turns the paper's Figure 7 into our prompt
    with blank lines removed -- so every printed character is reproduced.
    """
    paper = (GOLDEN / "figure7_paper_extraction.txt").read_text(encoding="utf-8")
    normalised = paper.replace("\u2019", "'").replace("\\/", "/").rstrip("\n").split("\n\n")
    ours = [line for line in (GOLDEN / "figure7_prompt.txt").read_text().rstrip("\n").split("\n") if line]
    assert normalised == ours


def test_user_message_shape():
    assert user_message(FIGURE7).endswith("Final Step: Return S7\n\nInputs:\nx = 5, y = 8")
    assert user_message(FIGURE7).startswith("Procedure:\nfunction(x, y):\n")


def test_inputs_render_ints_plainly_and_floats_by_shortest_repr():
    assert format_input(5) == "5"
    assert format_input(0.5) == "0.5"
    assert format_input(3.142) == "3.142"
    assert format_input(10.0) == "10.0"


def test_system_role_fallback_folds_system_text_into_user_turn():
    (only,) = chat_messages(FIGURE7, system_role=False)
    assert only["role"] == "user"
    assert only["content"] == SYSTEM_PROMPT + "\n\n" + user_message(FIGURE7)

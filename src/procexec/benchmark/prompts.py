"""Chat messages for an example (spec section 3).

The system text is the paper's Appendix B instruction, verbatim.  The paper's
text extraction shows it with every line separated by a blank line, curly
quotes and an escaped ``\\/``; those are typesetting artefacts (its Appendix A
Python code shows the same ones), so the lines here are single-spaced with
ASCII quotes.  ``tests/golden/`` holds the Figure 7 prompt both as rendered
here and as printed in the paper, and a test maps one onto the other.
"""

from __future__ import annotations

from procexec.records import Example

SYSTEM_PROMPT = """\
You are a deterministic procedure executor.
You will be given:
1. A procedure (step-by-step instructions)
2. Input values
Your task is to simulate the procedure exactly as written.
Execution rules:
- Execute each step sequentially, without skipping or reordering.
- Maintain exact intermediate state.
- Do not reinterpret or optimize steps.
Behavior:
Show step-by-step execution.
Include intermediate variable values after each step.
Output rules:
- Show all intermediate steps clearly.
- Use the same variable names as in the procedure (S1, S2, etc.).
- That line must be in the format: <answer>FINAL_RESULT</answer>.
- Do not include any additional text before or after these tags.
- Do not use phrases like 'The final result is'.
- The output must contain only the tagged answer.
- Example (correct):
<answer>42</answer>
Example (incorrect):
The final result is <answer>42</answer>
Answer: 42"""


def format_input(value: int | float) -> str:
    """Ints without a decimal point, floats as Python's shortest repr (spec section 1)."""
    return str(value) if type(value) is int else repr(float(value))


def user_message(example: Example) -> str:
    return f"Procedure:\n{example.procedure}\n\nInputs:\nx = {format_input(example.x)}, y = {format_input(example.y)}"


def chat_messages(example: Example, system_role: bool = True) -> list[dict[str, str]]:
    """System + user turns; without a system role the system text opens the user turn."""
    user = user_message(example)
    if system_role:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return [{"role": "user", "content": f"{SYSTEM_PROMPT}\n\n{user}"}]

"""Run in .venv-harness: inspect_ai 0.3.285 evaluates procexec/procedural (found through its entry point).

argv: SPEC_JSON.  The spec holds the task arguments, the log folder, and either a served model (``model``,
``base_url``) or ``scripted``: example id -> {text, stop_reason, completion}, answered by inspect's mockllm,
whose output token ids spell ``text`` (as vLLM's logprob tokens) while ``completion`` is what inspect's chat
path would leave in output.completion.  Prints the log's path, status, per-sample scores and metrics.
"""

import json
import sys

from inspect_ai import eval as inspect_eval
from inspect_ai.log import read_eval_log
from inspect_ai.model import ChatMessageAssistant, Logprob, Logprobs, ModelOutput, ModelUsage, get_model
from inspect_ai.model._model_output import ChatCompletionChoice

from procexec.harness.tokens import hf_tokenizer

spec = json.loads(open(sys.argv[1]).read())
task_args = spec["task_args"]


def scripted_output(case: dict) -> ModelOutput:
    ids = hf_tokenizer(task_args["model_dir"]).encode(case["text"], add_special_tokens=False)
    choice = ChatCompletionChoice(
        message=ChatMessageAssistant(content=case["completion"]), stop_reason=case["stop_reason"],
        logprobs=Logprobs(content=[Logprob(token=f"token_id:{i}", logprob=0.0) for i in ids]))
    return ModelOutput(model="mock", choices=[choice],
                       usage=ModelUsage(input_tokens=10, output_tokens=len(ids), total_tokens=10 + len(ids)))


if "scripted" in spec:  # one sample at a time: the outputs go out in the samples' order
    model = get_model("mockllm/model", custom_outputs=[scripted_output(c) for c in spec["scripted"].values()])
    options = {"max_samples": 1}
else:
    model = get_model(spec["model"], base_url=spec["base_url"], api_key="none")
    options = {"max_connections": 4}
[log] = inspect_eval("procexec/procedural", model=model, task_args=task_args, log_dir=spec["log_dir"],
                     log_format="json", display="none", fail_on_error=False, **options)
log = read_eval_log(log.location)
print(json.dumps({
    "log": log.location,
    "status": log.status,
    "task": log.eval.task_registry_name,
    "samples": {str(s.id): {"error": None if s.error is None else s.error.message,
                            "completion": s.output.completion, "prompt_token_ids": s.metadata["prompt_token_ids"],
                            "value": s.scores["procexec_scorer"].value if s.scores else None,
                            "metadata": s.scores["procexec_scorer"].metadata if s.scores else None}
                for s in log.samples},
    "metrics": {score.name: {m: v.value for m, v in score.metrics.items()} for score in log.results.scores}
    if log.results else {},
}, default=str))

"""Run in .venv-harness: procexec's lm-eval 0.4.13 tasks through lm-eval's own evaluator and log writer.

argv: SPEC_JSON.  The spec names the tasks, the task metadata (lengths, examples per length, dataset_path),
the output folder, and either a vLLM server (``local-completions`` with --apply_chat_template, as the CLI
runs it) or ``scripted``: example id -> text, answered by a model that returns those texts.  The results and
samples files are written as ``lm-eval run --log_samples --output_path`` writes them; prints the results.
"""

import json
import sys

from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager

from procexec.harness.lm_eval_files import TASK_DIR

spec = json.loads(open(sys.argv[1]).read())


class Scripted(LM):
    """Returns the scripted text of each request's example (no model)."""

    def generate_until(self, requests):
        return [spec["scripted"][request.doc["id"]] for request in requests]

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


if "scripted" in spec:
    model, model_args, name = Scripted(), {}, "scripted"
else:
    model, model_args, name = "local-completions", spec["model_args"], spec["model_args"]["model"]
tracker = EvaluationTracker(output_path=spec["output_path"])
manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False, metadata={**model_args, **spec["metadata"]})
results = simple_evaluate(model=model, model_args=model_args or None, tasks=spec["tasks"], task_manager=manager,
                          log_samples=True, apply_chat_template="scripted" not in spec,
                          gen_kwargs=spec.get("gen_kwargs"), evaluation_tracker=tracker, bootstrap_iters=0)
tracker.general_config_tracker.model_name = name
samples = results.pop("samples")
tracker.save_results_aggregated(results=results, samples=samples)
for task_name in results["configs"]:
    tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
print(json.dumps({"results": results["results"], "groups": results.get("groups", {})}, default=str))

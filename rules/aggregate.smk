# Stage 6, aggregate: every run model's scores -> tidy metrics with bootstrap intervals.


rule aggregate:
    input:
        scores=STUDY.score_files(),
    output:
        scores=f"{RESULTS}/aggregate/scores.parquet",
        metrics=f"{RESULTS}/aggregate/metrics.parquet",
        metrics_csv=f"{RESULTS}/aggregate/metrics.csv",
    log:
        f"{LOGS}/aggregate/aggregate.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/aggregate.tsv"
    group:
        STUDY.cpu_group("aggregate")
    conda:
        ANALYSIS_ENV
    params:
        resamples=AGGREGATE_RESAMPLES,
        seed=AGGREGATE_SEED,
        out_dir=lambda wildcards, output: dir_of(output),
    shell:
        "procexec aggregate --scores {input.scores} --out-dir {params.out_dir}"
        " --resamples {params.resamples} --seed {params.seed} > {log} 2>&1"

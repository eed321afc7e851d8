# Stage 5: per-example scores, one job per (model, dataset).


rule score:
    input:
        generations="results/generations/{model}/{dataset}.jsonl.gz",
        references="results/references/{dataset}.jsonl",
        dataset="results/datasets/{dataset}.jsonl",
    output:
        "results/scores/{model}/{dataset}.parquet",
    log:
        "logs/score/{model}/{dataset}.log",
    benchmark:
        "results/benchmarks/score/{model}/{dataset}.tsv"
    group:
        cpu_group("score")
    conda:
        ANALYSIS_ENV
    shell:
        "procexec score --generations {input.generations}"
        " --references {input.references} --dataset {input.dataset}"
        " --out {output} > {log} 2>&1"

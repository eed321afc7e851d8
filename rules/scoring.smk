# Stage 5, scoring: per-example scores, one job per (model, dataset).


rule score:
    input:
        generations=f"{RESULTS}/generations/{{model}}/{{dataset}}.jsonl.gz",
        references=f"{RESULTS}/references/{{dataset}}.jsonl",
        dataset=f"{RESULTS}/datasets/{{dataset}}.jsonl",
    output:
        f"{RESULTS}/scores/{{model}}/{{dataset}}.parquet",
    log:
        f"{LOGS}/score/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/score/{{model}}/{{dataset}}.tsv"
    group:
        STUDY.cpu_group("score")
    conda:
        ANALYSIS_ENV
    params:
        columns=SCORE_FORMAT,  # a new score column rescores (procexec.cluster.workflow)
    shell:
        "procexec score --generations {input.generations}"
        " --references {input.references} --dataset {input.dataset}"
        " --out {output} > {log} 2>&1"

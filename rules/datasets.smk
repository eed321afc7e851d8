# Stage 1, datasets: the benchmark suite.  One job per dataset; a dataset file depends
# only on its id and the suite's seed/sizes (params.settings), never on code.


rule generate:
    output:
        f"{RESULTS}/datasets/{{dataset}}.jsonl",
    log:
        f"{LOGS}/generate/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/generate/{{dataset}}.tsv"
    group:
        STUDY.cpu_group("generate")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        settings=SUITE_SETTINGS,
    shell:
        "procexec generate --config {params.config} --dataset {wildcards.dataset}"
        " --out {output} > {log} 2>&1"


rule card:
    input:
        datasets=STUDY.dataset_files(),
    output:
        f"{RESULTS}/datasets/CARD.md",
    log:
        f"{LOGS}/card/card.log",
    benchmark:
        f"{RESULTS}/benchmarks/card/card.tsv"
    group:
        STUDY.cpu_group("card")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        settings=SUITE_SETTINGS,
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
        ids=lambda wildcards, input: ids_of(input.datasets, ".jsonl"),
    shell:
        "procexec card --config {params.config} --datasets-dir {params.datasets_dir}"
        " --datasets {params.ids} --out {output} > {log} 2>&1"

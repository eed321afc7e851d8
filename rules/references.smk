# Stage 2: reference execution (spec section 2 semantics) and the paper's Table 4.


rule execute:
    input:
        "results/datasets/{dataset}.jsonl",
    output:
        "results/references/{dataset}.jsonl",
    log:
        "logs/execute/{dataset}.log",
    benchmark:
        "results/benchmarks/execute/{dataset}.tsv"
    group:
        cpu_group("execute")
    conda:
        ANALYSIS_ENV
    params:
        semantics="default",
    shell:
        "procexec execute --in {input} --out {output}"
        " --semantics {params.semantics} > {log} 2>&1"


rule table4:
    input:
        references=reference_files,
    output:
        "results/references/table4.csv",
    log:
        "logs/table4/table4.log",
    benchmark:
        "results/benchmarks/table4/table4.tsv"
    group:
        cpu_group("table4")
    conda:
        ANALYSIS_ENV
    params:
        references_dir=lambda wildcards, input: dir_of(input.references),
        ids=lambda wildcards, input: ids_of(input.references, ".jsonl"),
        # the study's one Table 4 semantics (procexec.benchmark.table4.TABLE4_SEMANTICS)
        semantics=TABLE4_SEMANTICS,
    shell:
        "procexec table4 --references-dir {params.references_dir}"
        " --datasets {params.ids} --semantics {params.semantics} --out {output} > {log} 2>&1"

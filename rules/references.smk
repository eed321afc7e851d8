# Stage 2, references: reference execution (spec section 2 semantics) and the paper's Table 4.


rule execute:
    input:
        f"{RESULTS}/datasets/{{dataset}}.jsonl",
    output:
        f"{RESULTS}/references/{{dataset}}.jsonl",
    log:
        f"{LOGS}/execute/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/execute/{{dataset}}.tsv"
    group:
        STUDY.cpu_group("execute")
    conda:
        ANALYSIS_ENV
    params:
        semantics="default",
    shell:
        "procexec execute --in {input} --out {output}"
        " --semantics {params.semantics} > {log} 2>&1"


rule table4:
    input:
        references=STUDY.reference_files(),
    output:
        f"{RESULTS}/references/table4.csv",
    log:
        f"{LOGS}/table4/table4.log",
    benchmark:
        f"{RESULTS}/benchmarks/table4/table4.tsv"
    group:
        STUDY.cpu_group("table4")
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

# The pilot's loops (docs/decisions.md, "Loops"): per model, every rerun of the pilot
# against the repetition guard (procexec loops: where the guard would have stopped it,
# what the text cut there scores, escapes), and the full study projected from the
# pilot's stores with and without the guard (procexec cost --measured), both read by
# the report's "Loops" section.  Outside the pilot these rules have no targets.


rule loops:
    input:
        generations=lambda wildcards: STUDY.model_generation_files(wildcards.model),
        references=STUDY.reference_files(),
        datasets=STUDY.dataset_files(),
    output:
        f"{RESULTS}/loops/{{model}}.json",
    log:
        f"{LOGS}/loops/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/loops/{{model}}.tsv"
    wildcard_constraints:
        model=alternatives(STUDY.generated_models),
    group:
        STUDY.cpu_group("loops")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        guard=lambda wildcards: STUDY.guard_settings(wildcards.model),
        references_dir=lambda wildcards, input: dir_of(input.references),
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
    shell:
        "procexec loops --config {params.config} --model {wildcards.model}"
        " --generations {input.generations} --references-dir {params.references_dir}"
        " --datasets-dir {params.datasets_dir} --out {output} > {log} 2>&1"


rule pilot_cost:
    input:
        # every generated model's shards: its store holds the whole pilot
        shards=[f for m in STUDY.generated_models for f in STUDY.shard_files(m)],
    output:
        f"{RESULTS}/cost.json",
    log:
        f"{LOGS}/pilot_cost/cost.log",
    benchmark:
        f"{RESULTS}/benchmarks/pilot_cost/cost.tsv"
    group:
        STUDY.cpu_group("pilot_cost")
    conda:
        ANALYSIS_ENV
    params:
        config=STUDY.full_config_file,
    shell:
        "procexec cost --config {params.config} --measured results --json"
        " --out {output} > {log} 2>&1"

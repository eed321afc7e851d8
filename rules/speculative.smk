# The pilot's speculative half (config `pilot_speculative`; procexec.cluster.study_stages):
# each vLLM model's pilot slice generated again with that speculative_config, into a
# store of its own (its keys differ: speculative_config is keyed when set), then
# compared with the plain half for the report ("Speculative decoding in the pilot":
# acceptance, decode rate, token ids identical to plain greedy).  Without
# pilot_speculative, or outside the pilot, these rules have no targets.

from procexec.cluster.study_stages import SPECULATIVE_STORE


rule infer_speculative:
    input:
        manifest="results/models/{model}/manifest.json",
        prompt="results/prompts/{model}.json",
        check=f"{CHECKS}/models/{{model}}/check.json",
        datasets=STUDY.dataset_files(),
    output:
        f"{RESULTS}/generations/{{model}}/speculative/shards/{{shard}}-of-{{nshards}}.jsonl.gz",
    log:
        f"{LOGS}/infer_speculative/{{model}}/{{shard}}-of-{{nshards}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/infer_speculative/{{model}}/{{shard}}-of-{{nshards}}.tsv"
    wildcard_constraints:
        model=alternatives(STUDY.speculative_models),
    conda:
        INFERENCE_ENV
    threads: lambda wildcards: STUDY.infer_threads(wildcards.model)
    resources:
        **INFER_RESOURCES,  # rules/common.smk: as rule infer's
    params:
        config=CONFIG_FILE,
        settings=lambda wildcards: STUDY.speculative_settings(wildcards.model),
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
        ids=lambda wildcards, input: ids_of(input.datasets, ".jsonl"),
        store=lambda wildcards: f"results/generations/{wildcards.model}/{SPECULATIVE_STORE}",
        lease=Path(workflow.basedir, "workflow_scripts", "gpu_lease.py"),
        head_step=lambda wildcards: STUDY.head_step(wildcards.model),
    shell:
        'lease=; if [ -n "${{PROCEXEC_GPU_POOL:-}}" ] && [ {resources.gpu} -gt 0 ]; then'
        ' lease="python3 {params.lease} --gpus {resources.gpu} --"; fi;'
        ' head={params.head_step:q}; if [ -n "$head" ]; then head="$head --cpus-per-task={threads}"; fi;'
        " $lease $head procexec infer --speculative --config {params.config} --model {wildcards.model}"
        " --datasets-dir {params.datasets_dir} --datasets {params.ids}"
        " --shard {wildcards.shard} --num-shards {wildcards.nshards}"
        " --manifest {input.manifest} --store {params.store}"
        " --out {output} > {log} 2>&1"


rule speculative_pilot:
    input:
        plain=lambda wildcards: STUDY.shard_files(wildcards.model),
        speculative=lambda wildcards: STUDY.speculative_shard_files(wildcards.model),
    output:
        f"{RESULTS}/speculative/{{model}}.json",
    log:
        f"{LOGS}/speculative_pilot/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/speculative_pilot/{{model}}.tsv"
    wildcard_constraints:
        model=alternatives(STUDY.speculative_models),
    group:
        STUDY.cpu_group("speculative_pilot")
    conda:
        ANALYSIS_ENV
    params:
        plain_store=lambda wildcards: f"results/generations/{wildcards.model}/store",
        speculative_store=lambda wildcards: f"results/generations/{wildcards.model}/{SPECULATIVE_STORE}",
    shell:
        "procexec speculative-pilot --model {wildcards.model}"
        " --plain {input.plain} --speculative {input.speculative}"
        " --plain-store {params.plain_store} --speculative-store {params.speculative_store}"
        " --out {output} > {log} 2>&1"

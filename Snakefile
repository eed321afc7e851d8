# The procexec workflow, its stages in order: datasets -> references -> models ->
# generation -> scoring -> aggregate -> figures/tables -> report (and release, on
# request), a rule file each.  See docs/workflow.md; the words: docs/glossary.md.
#
#     snakemake --profile cpu-demo --configfile config/demo.yaml   # laptop demo
#     snakemake --profile h200                                     # the paper's study
#
# The configuration (config.yaml plus any --configfile, deep-merged) is parsed
# strictly (rules/preflight.smk) and validated by procexec.config before anything
# runs; a problem is one line and exit code 2.  rules/common.smk builds the study the
# rules read (ids, parameters, inputs, resources) and says which rules run on the submit host.


from snakemake.utils import min_version

# Rerun triggers and the SLURM plugin were checked against this Snakemake (docs/workflow.md).
min_version("9.27")


include: "rules/preflight.smk"  # strict parse of every config file, before Snakemake's own


configfile: workflow.source_path("config.yaml")


report: "reports/workflow.rst"  # snakemake --report: figures, tables and the appendix report, with captions


include: "rules/common.smk"
include: "rules/datasets.smk"
include: "rules/references.smk"
include: "rules/models.smk"
include: "rules/generation.smk"
include: "rules/speculative.smk"
include: "rules/loops.smk"
include: "rules/scoring.smk"
include: "rules/aggregate.smk"
include: "rules/figures.smk"
include: "rules/report.smk"
include: "rules/release.smk"


rule all:
    input:
        f"{RESULTS}/report/index.html",
        f"{RESULTS}/datasets/CARD.md",
        f"{RESULTS}/references/table4.csv",


# `snakemake release`: the dataset folders of rules/release.smk (not part of all).
rule release:
    input:
        f"{RESULTS}/release/suite",
        f"{RESULTS}/release/generations",


# The commands read the merged config from results/config/<sha>.json, written once jobs are
# about to run: a dry run or --lint writes nothing.
onstart:
    write_merged_config(STUDY.raw)
    write_merged_config(
        STUDY.full_raw
    )  # the full study, which the pilot's cost projects


# Where jobs run: printed so that a dry run under --profile h200 shows what SLURM would get.
report_placement()

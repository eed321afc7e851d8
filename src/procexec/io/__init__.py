"""Files and formats every stage shares: atomic writes, output sets, JSON Lines, parquet, Snakemake's job
benchmark files, numbers as shown.

The lowest layer but errors and records.
"""

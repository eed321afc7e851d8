# Read before anything else (the Snakefile includes this file before its `configfile:`).
#
# Every config file is parsed by procexec.config.read_yaml first (JSON first, then YAML,
# as Snakemake reads it): UTF-8 only, a key
# written twice in one mapping is an error (plain YAML lets the last one win), and a
# syntax error names the file, line and column; a value Snakemake's own YAML loader would
# raise on (an unquoted impossible date, `template_date: 2026-13-45`) is named by its key
# (procexec.config.value_problems).  A problem is printed once, as one
# line, and the workflow exits with code 2 and no traceback, like the commands.
#
# Limit: Snakemake 9.27 parses every --configfile in its own command-line handling,
# before any workflow code runs, so a syntax error or non-UTF-8 bytes in an overlay
# stop Snakemake with its own message ("Config file is not valid JSON or YAML");
# `procexec check-config config.yaml OVERLAY ...` names the file and line.  An overlay
# Snakemake did accept (e.g. one with a repeated key) is checked here.

import sys
from pathlib import Path

from procexec.config import read_yaml, value_problems
from procexec.errors import ProcexecError


def stop(message):
    """One line on stderr, exit code 2 (sys.exit: Snakemake prints no traceback for it)."""
    print(f"procexec workflow: error: {message}", file=sys.stderr)
    sys.exit(2)


def preflight(paths):
    """Each file read strictly, and the values Snakemake's own YAML loader would raise on (an unquoted
    impossible date such as 2026-13-45: a ValueError with frames) named by key."""
    for path in paths:
        try:
            document = read_yaml(path)
        except ProcexecError as exc:
            stop(exc)
        problems = value_problems(document)
        if problems:
            stop(f"{path}: {problems[0]}")


preflight([Path(workflow.basedir, "config.yaml"), *workflow.overwrite_configfiles])

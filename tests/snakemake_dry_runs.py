"""Snakemake's dry run (``snakemake -n``) of the workflow on each of many configs, one after another in this process.

    python tests/snakemake_dry_runs.py WORK < configs.jsonl
    python tests/snakemake_dry_runs.py --serve      (any dry runs: ``serve``)

Reads one JSON string per line on stdin, a config's text; writes one JSON line per config on stdout, in order:
``{"code": exit code, "output": what the run wrote to file descriptors 1 and 2 (Snakemake's logging too),
"written": what the run left in WORK besides Snakemake's .snakemake/, "check_config": procexec check-config's
verdict on the same file, {"code", "error"}}``.  WORK is a copy of the workflow (the
Snakefile, rules, envs, workflow_scripts and config linked to the checkout) whose config.yaml each config
becomes in turn, and ``snakemake.cli.main`` runs there as the command line would.

Why one process and one folder: Snakemake's import is most of one ``snakemake -n``'s cost, and on ext4 the
inodes of a folder per run cost more kernel time than the runs (inode allocation, measured with perf).  For the
same reason Snakemake's caches, a dozen folders and files it makes and deletes per run, go to memory where the
machine has a tmpfs (/dev/shm): measured, 1.6 s of system time for 1,079 runs instead of 8.7 s.  A dry run
trusts no cache of an earlier one (its iocache is read only with --trust-io-cache).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("Snakefile", "rules", "envs", "workflow_scripts", "config")
OWN = {*LINKED, "config.yaml", ".snakemake"}
#: Address space of this process (~1.5 GiB used): a config that asks a DAG without end (10**30 shards of a run
#: model) ends in a MemoryError, not in the OOM killer's choice of a process on the machine.
ADDRESS_SPACE = 4 << 30
IN_MEMORY = Path("/dev/shm")


def reuse_what_each_run_rebuilds() -> None:
    """What every dry run builds again from the same input, built once: Snakemake's parse of each file into Python,
    the compile of that Python, and its command-line parser (profiled over 1,041 runs: the parser 8 % of the
    time, the compile 3.5 %).

    The parse (``snakemake.parser.parse``, a third of a run's time before) is a pure function of the file's
    text, its path, the rules counted before it and the shell override: the same key gives the same code, rule
    count and line map, and the run then executes that code as ``snakemake -n`` does.  A code object is never
    changed by running it; the parser without profiles is never changed by parsing (a profile's run builds its
    own, with the profile's defaults)."""
    import snakemake.cli  # noqa: F401 -- first: snakemake.workflow imported alone meets an import cycle
    import snakemake.workflow

    parse = snakemake.workflow.parse
    parsed: dict[tuple, tuple[str, int, dict[int, int]]] = {}

    def parse_once(path, workflow, linemap, overwrite_shellcmd=None, rulecount=0):
        name = path.get_path_or_uri(secret_free=True)
        key = (name, Path(name).read_bytes(), rulecount, overwrite_shellcmd)
        if key not in parsed:
            lines: dict[int, int] = {}
            code, count = parse(path, workflow, lines, overwrite_shellcmd=overwrite_shellcmd, rulecount=rulecount)
            parsed[key] = (code, count, lines)
        code, count, lines = parsed[key]
        linemap.update(lines)
        return code, count

    snakemake.workflow.parse = parse_once
    snakemake.workflow.compile = functools.cache(compile)  # the module's global, ahead of the builtin
    argument_parser = snakemake.cli.get_argument_parser
    without_profiles = argument_parser()
    snakemake.cli.get_argument_parser = lambda profiles=None: (
        argument_parser(profiles) if profiles else without_profiles
    )


def snakemake_main(argv: list[str], stdout, stderr) -> int:
    """``snakemake ARGV`` as the command line runs it, file descriptors 1 and 2 into ``stdout`` and ``stderr``
    (files; Snakemake's logging writes to the descriptors too); its exit code."""
    from snakemake.cli import main as snakemake

    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    try:
        snakemake(argv)  # it always ends in sys.exit
    except SystemExit as exc:  # the process's exit status: sys.exit(None) is 0, sys.exit("text") 1
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved_fd in enumerate(saved, start=1):
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
    return 0


def dry_run(output) -> int:
    """``snakemake -n`` in the current folder, file descriptors 1 and 2 into ``output``; its exit code."""
    return snakemake_main(["-s", "Snakefile", "-n", "--nocolor"], output, output)


def check_config() -> dict:
    """``procexec check-config config.yaml``'s verdict, as the command reaches it (``Study.checked``), in this
    process: the workflow's code is imported already, and the command line's parser costs more than the check."""
    from procexec.cluster.workflow import Study
    from procexec.errors import ProcexecError

    try:
        Study.checked(["config.yaml"])
    except ProcexecError as exc:
        return {"code": 2, "error": " ".join(str(exc).split())}
    return {"code": 0, "error": ""}


def dry_runs(work: Path) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.getrlimit(resource.RLIMIT_AS)[1]))
    work.mkdir(parents=True)
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    os.chdir(work)
    reuse_what_each_run_rebuilds()
    in_memory = IN_MEMORY if os.access(IN_MEMORY, os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=in_memory) as caches, tempfile.TemporaryFile() as output:
        os.environ["XDG_CACHE_HOME"] = tempfile.tempdir = caches  # its source cache; its temporary folder
        for line in sys.stdin:
            Path("config.yaml").write_text(json.loads(line))
            output.seek(0)
            output.truncate()
            code = dry_run(output)
            output.seek(0)
            text = output.read().decode(errors="replace")
            written = sorted(set(os.listdir()) - OWN)
            verdict = check_config()
            print(json.dumps({"code": code, "output": text, "written": written, "check_config": verdict}), flush=True)


def serve() -> None:
    """``python tests/snakemake_dry_runs.py --serve``: one request per line on stdin, ``{"argv": the arguments
    after "snakemake", "cwd": the folder it runs in, "env": its whole environment, "umask"}``; one answer per
    line on stdout, ``{"code", "stdout", "stderr"}``, as ``subprocess.run`` would give them
    (tests/workflow_runs.py sends a test's dry runs here)."""
    reuse_what_each_run_rebuilds()
    home, environ = os.getcwd(), dict(os.environ)
    for line in sys.stdin:
        request = json.loads(line)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        umask = os.umask(request["umask"])
        try:
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                code = snakemake_main(request["argv"], out, err)
                out.seek(0)
                err.seek(0)
                answer = {"code": code, "stdout": out.read().decode(errors="replace")}
                answer["stderr"] = err.read().decode(errors="replace")
        finally:
            os.umask(umask)
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(home)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    else:
        dry_runs(Path(sys.argv[1]))

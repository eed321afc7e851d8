"""Each procexec process, and each process of a job's vLLM server, collects garbage rarely from its start
(procexec.engine.startup); a library import of procexec leaves the host process's collector alone."""

from __future__ import annotations

import ast
import subprocess
import sys

from procexec.engine.startup import STARTUP_GC_THRESHOLDS


def thresholds_after(code: str) -> tuple[int, int, int]:
    """``gc.get_threshold()`` in a fresh interpreter once ``code`` ran."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport gc\nprint(gc.get_threshold())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_a_command_collects_rarely_from_its_start():
    code = "from procexec.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass"
    assert thresholds_after(code) == STARTUP_GC_THRESHOLDS


def test_each_process_a_server_spawns_collects_rarely():
    # what multiprocessing's spawn runs in each API and engine process of `python -m procexec.engine.serve`
    # before it unpickles (and imports) anything of vLLM: the parent's main module, as __mp_main__
    code = "import runpy\nrunpy.run_module('procexec.engine.serve', run_name='__mp_main__', alter_sys=True)"
    assert thresholds_after(code) == STARTUP_GC_THRESHOLDS


def test_importing_procexec_leaves_the_collector_alone():
    default = thresholds_after("pass")
    assert default != STARTUP_GC_THRESHOLDS
    assert thresholds_after("import procexec.cli, procexec.engine.serve") == default

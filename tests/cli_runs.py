"""``procexec ARGV`` run in the test's process: a command's exit code and what it printed, as a subprocess gives
them, without the 5-7 CPU s a process of its own pays to import vLLM again (a test worker has it imported).

What a command sets in the environment (``work_offline``: ``HF_HUB_OFFLINE``) is undone after it.  The console
script itself, and what only a process of its own shows (a signal, an exit status), are tested by starting it
(tests/cli/test_cli_core.py, tests/io/test_kills.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from procexec.cli import main


def procexec_in_process(*argv: object) -> subprocess.CompletedProcess:
    """The command's exit code (an argparse usage error's too), stdout and stderr."""
    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    environ = dict(os.environ)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os.environ.clear()
            os.environ.update(environ)
    return subprocess.CompletedProcess(["procexec", *args], code, out.getvalue(), err.getvalue())

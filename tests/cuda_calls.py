"""A command run with every ``torch.cuda`` function instrumented (tests/data/cuda_spy/sitecustomize.py): its
environment, and the calls it logged (GPU-only start-up failures caught on the CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from procexec.engine.device import FORK_SAFE_CHECK

SPY = Path(__file__).resolve().parent / "data" / "cuda_spy"


def spied_env(log: Path) -> dict[str, str]:
    """The environment of a command whose torch.cuda calls are logged to ``log``, the fork-safe check unset."""
    env = {k: v for k, v in os.environ.items() if k != FORK_SAFE_CHECK}
    env["PYTHONPATH"] = os.pathsep.join([str(SPY), env.get("PYTHONPATH", "")])
    env["PROCEXEC_CUDA_SPY_LOG"] = str(log)
    return env


def spied_calls(log: Path) -> list[dict]:
    """The calls the command made, each with the fork-safe check's value it saw."""
    assert log.exists(), "the spy was not loaded (tests/data/cuda_spy/sitecustomize.py)"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0] == {"spy": "installed"}
    return lines[1:]

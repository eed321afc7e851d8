"""Test instrument (tests/engine/test_device.py): record the environment at every ``torch.cuda`` call.

Loaded by Python at start-up when this folder is on PYTHONPATH and
PROCEXEC_CUDA_SPY_LOG names a file.  Every public function of ``torch.cuda`` is
wrapped; each distinct (function, value of PYTORCH_NVML_BASED_CUDA_CHECK) pair
is appended to the log as one JSON line.  On a GPU, a call made while the
variable is unset goes through cudaGetDeviceCount and poisons fork.
"""

import json
import os

LOG = os.environ.get("PROCEXEC_CUDA_SPY_LOG")

if LOG:
    import functools
    import inspect

    import torch.cuda

    seen = set()

    def _record(name):
        env = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
        if (name, env) not in seen:
            seen.add((name, env))
            with open(LOG, "a") as handle:
                handle.write(json.dumps({"call": name, "env": env}) + "\n")

    def _spy(name, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            _record(name)
            return function(*args, **kwargs)

        return wrapper

    with open(LOG, "w") as handle:
        handle.write(json.dumps({"spy": "installed"}) + "\n")
    namespace = vars(torch.cuda)
    for name, value in list(namespace.items()):
        if name.startswith("__") or not inspect.isfunction(value):
            continue
        if not (getattr(value, "__module__", "") or "").startswith("torch.cuda"):
            continue
        namespace[name] = _spy(f"torch.cuda.{name}", value)

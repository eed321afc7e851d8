"""Write the pip list of each conda environment file from its lock.

    python envs/sync_env_yaml.py            # rewrite envs/<env>.yaml from envs/<env>.lock.txt
    python envs/sync_env_yaml.py --check    # exit 1 if any yaml differs from its lock

`make lock-envs` runs it after `uv pip compile`. Why the yaml carries the whole
lock instead of a `-r <env>.lock.txt` line: Snakemake (9.27,
snakemake/deployment/conda.py) copies the yaml to .snakemake/conda/<hash>.yaml
and runs `conda env create --file` on that copy; conda runs pip from the
copy's directory, where a relative `-r` finds nothing. And the environment's
hash covers the yaml (and the post-deploy script) only: a lock change that the
yaml did not show would not rebuild the environment.

Everything in the yaml above the line MARKER is kept; the list below it is
the lock's lines: '--only-binary :all:' (no build from source on the nodes: a
missing wheel fails the install instead of compiling), then one requirement
per locked package with the lock's hashes. Conda writes the list verbatim into
a requirements file for pip, which checks every downloaded file's hash.
Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ENVS = Path(__file__).resolve().parent
ENV_NAMES = ("analysis", "inference-cuda")
MARKER = "      # generated from envs/{name}.lock.txt by envs/sync_env_yaml.py (make lock-envs); do not edit below"
ITEM_INDENT = "      - "


def locked_requirements(lock_text: str) -> list[str]:
    """The lines of a `uv pip compile --generate-hashes --emit-build-options`
    output: its build options ('--only-binary :all:') and one line per package,
    'name==version --hash=sha256:... ...' (continuations joined, comments dropped)."""
    logical: list[str] = []
    current = ""
    for raw in lock_text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        current += line.strip()
        logical.append(" ".join(current.split()))
        current = ""
    if current.strip():
        logical.append(" ".join(current.split()))
    for req in logical:
        if not (
            re.fullmatch(r"--(only|no)-binary \S+", req)
            or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\-]*==\S+( --hash=sha256:[0-9a-f]{64})+", req)
        ):
            raise ValueError(f"unexpected lock line (not 'name==version --hash=...'): {req[:120]}")
    return logical


def render(name: str, yaml_text: str, lock_text: str) -> str:
    """The yaml with everything below MARKER replaced by the lock's requirements."""
    marker = MARKER.format(name=name)
    head, sep, _ = yaml_text.partition(marker + "\n")
    if not sep:
        raise ValueError(f"envs/{name}.yaml lacks the line\n{marker}")
    # double-quoted (a JSON string is a YAML one): '--only-binary :all:' unquoted
    # would read as a mapping
    return head + marker + "\n" + "".join(f"{ITEM_INDENT}{json.dumps(req)}\n" for req in locked_requirements(lock_text))


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    stale = []
    for name in ENV_NAMES:
        yaml_path = ENVS / f"{name}.yaml"
        lock_path = ENVS / f"{name}.lock.txt"
        old = yaml_path.read_text()
        new = render(name, old, lock_path.read_text())
        if new != old:
            stale.append(yaml_path.name)
            if not check:
                yaml_path.write_text(new)
    if check and stale:
        print(
            f"out of date with their locks: {', '.join(stale)} (run python envs/sync_env_yaml.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

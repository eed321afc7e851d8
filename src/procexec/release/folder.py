"""A Hugging Face dataset folder: parquet per config, a README whose YAML header declares them, the upload.

Shape (``datasets`` 5.2 reads it as a local folder and from the hub alike): ``data/<config>/test-00000-of-
00001.parquet`` per config, one ``test`` split, and ``README.md`` = YAML ``configs`` (each with its
``features``) + the card.  The bytes are a function of the tables alone: no timestamps, no pandas metadata,
fixed writer options, so an export run twice, or on another machine with the same pyarrow, is identical.

The folder is built beside its target and swapped in whole (two renames and the old folder's removal, with
SIGINT and SIGTERM held until they are done): a failed or interrupted export leaves the previous folder as it
was and nothing beside it; only a SIGKILL in the swap leaves the old one under ``.<name>.old-*``.  What may
be replaced is decided first (``output_folder``): never a folder the command reads, one holding it or one
inside it, nor one holding the working folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from procexec.errors import ProcexecError, describe_os_error
from procexec.io.files import deferred_signals, sha256_file

SPLIT = "test"  # lm-eval's test_split; split names may not hold dashes, config names may
ALL_CONFIG = "all"  # every config's rows, the folder's default
TOKEN_VARIABLE = "HF_TOKEN"


def data_file(config: str) -> str:
    return f"data/{config}/{SPLIT}-00000-of-00001.parquet"


def features_yaml(schema: pa.Schema) -> list[dict[str, str]]:
    """``datasets``' YAML form of an Arrow schema of scalar and list-of-scalar columns."""

    def dtype(kind: pa.DataType) -> str:
        return {pa.float64(): "float64", pa.bool_(): "bool"}.get(kind, str(kind))

    return [
        {"name": f.name, "list": dtype(f.type.value_type)}
        if pa.types.is_list(f.type)
        else {"name": f.name, "dtype": dtype(f.type)}
        for f in schema
    ]


def readme(configs: list[str], schema: pa.Schema, card: str) -> str:
    """README.md: ``all`` (the default, over every file) with the features, then one config per name.

    The features are declared once: every config's parquet carries the same Arrow schema, which ``datasets``
    reads as these features, and the README is parsed in pure Python on every load (24 features x 56
    configs took ~1 s a load).
    """
    entries = [
        {
            "config_name": ALL_CONFIG,
            "default": True,
            "data_files": [{"split": SPLIT, "path": f"data/*/{SPLIT}-*.parquet"}],
            "features": features_yaml(schema),
        },
        *({"config_name": name, "data_files": [{"split": SPLIT, "path": data_file(name)}]} for name in configs),
    ]
    header = yaml.safe_dump({"license": "apache-2.0", "configs": entries}, sort_keys=False, width=1000)
    return f"---\n{header}---\n\n{card}"


def write_table(table: pa.Table, path: Path) -> None:
    """Parquet with fixed options: one row group, zstd, dictionary-encoded (the repeated prompt text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        table.replace_schema_metadata(None),
        path,
        compression="zstd",
        compression_level=9,
        row_group_size=max(len(table), 1),
        use_dictionary=True,
        write_statistics=True,
        store_schema=True,
    )


#: (what, path): one input of an export, as a refusal names it.
Input = tuple[str, str | os.PathLike[str]]


def output_folder(out: str | os.PathLike[str], inputs: Iterable[Input]) -> Path:
    """``--out`` as the folder an export replaces whole, checked before any work: its real path (a symlink's
    folder is replaced, the link kept), refused in one line when it is not a folder, when it is, holds or lies
    inside one of ``inputs`` (what the command reads), or when it holds the working folder."""
    target = Path(out).resolve()
    if target.exists() and not target.is_dir():
        raise ProcexecError(f"--out {out}: exists and is not a folder")
    if target.parent == target:
        raise ProcexecError(f"--out {out}: the file system's root, not a dataset folder")
    for what, path in [*inputs, ("the working folder", Path.cwd())]:
        real = Path(path).resolve()
        if real == target or real.is_relative_to(target):
            verb = "is" if real == target else "holds"
            raise ProcexecError(f"--out {out}: {verb} {what} ({path}), which replacing it would delete")
        if target.is_relative_to(real) and what != "the working folder":
            raise ProcexecError(f"--out {out}: lies inside {what} ({path}); write the export elsewhere")
    return target


@contextlib.contextmanager
def dataset_folder(target: Path) -> Iterator[Path]:
    """A fresh folder to build ``target`` (``output_folder``'s) in; on a clean exit it replaces ``target`` whole,
    on an error or an interrupt it vanishes."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        building = target.with_name(f".{target.name}.building-{os.getpid()}-{secrets.token_hex(4)}")
        building.mkdir()
    except OSError as exc:
        raise ProcexecError(f"{target}: cannot write ({describe_os_error(exc)})") from None
    try:
        yield building
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        with deferred_signals():  # Ctrl-C or SIGTERM in the swap waits for the old folder to be gone
            if target.exists():
                target.rename(old)
            building.rename(target)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def file_checksums(folder: Path, configs: list[str]) -> list[tuple[str, str]]:
    """(data file, sha256) per config, for the card."""
    return [(data_file(name), sha256_file(folder / data_file(name))) for name in configs]


def hub_token() -> str:
    """The upload token, from the environment only (checked before any export work)."""
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise ProcexecError(
            f"--push: set {TOKEN_VARIABLE} in the environment to a Hugging Face token with write access"
        )
    return token


def push(folder: Path, repo: str, token: str, message: str) -> str:
    """Upload the folder to the dataset repo ``repo`` in one commit; returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        api.create_repo(repo, repo_type="dataset", exist_ok=True)
        info: Any = api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=folder, commit_message=message)
    except (HfHubHTTPError, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ProcexecError(f"--push {repo}: upload failed ({first[:200]})") from None
    return str(getattr(info, "commit_url", info))

"""A fuzz test per input format, driving the real command that reads it (issue 22).

Each format is one ``Format``: a generator of a valid file, the command that
reads it, and the fields a wrong-type mutation may hit.  Every mutation
(truncation, wrong type per field, NaN, same-size corruption, a byte more or
less, foreign but well-formed data) must end in the contract -- exit 2, one
line ``procexec CMD: error: ...`` naming the file, no traceback, the input
untouched, no temporary left -- or in a success the command is entitled to (a
mutation that left a valid file).  A new format joins by adding its ``Format``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procexec.cli import main

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "config.yaml").read_text())
KEY = "qw-4"


def run(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@dataclass
class Format:
    name: str
    filename: str
    valid: Callable[[], bytes]  # a valid file's bytes
    command: Callable[[Path, Path], list]  # (the file, a work folder) -> argv of the command that reads it
    fields: Callable[[Any], list[tuple[list, Any]]] | None = None  # (path, value) pairs of the parsed document
    parse: Callable[[bytes], Any] | None = None
    dump: Callable[[Any], bytes] | None = None



def _lock() -> bytes:
    entry = {"hf_id": RAW["models"][KEY]["hf_id"], "revision": RAW["models"][KEY].get("revision", "main"),
             "commit": "0123456789abcdef0123456789abcdef01234567", "generation": 1,
             "locked_utc": "2026-01-01T00:00:00Z"}
    return yaml.safe_dump({"models": {KEY: entry}}).encode()


def _lock_command(path: Path, work: Path) -> list:
    overlay = work / "overlay.yaml"
    overlay.write_text(f"model_lock: {json.dumps(str(path))}\nrun_models: [{KEY}]\n")
    return ["check-config", ROOT / "config.yaml", overlay]


def _tsv() -> bytes:
    return b"s\th:m:s\tmax_rss\tmax_vms\n3600.5\t1:00:00\t100.2\t200.1\n12.25\t0:00:12\t99.0\t150.0\n"


def _status_command(path: Path, work: Path) -> list:
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**RAW, "run_models": [KEY]}))
    results = work / "results"
    target = results / "benchmarks" / "infer" / KEY / "1-of-1.tsv"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.is_symlink():
        target.symlink_to(path)
    (results / "generations").mkdir(exist_ok=True)
    return ["status", "--config", config, "--results", results, "--json"]


def _store_files(folder: Path) -> None:
    """A store of three generations (one writer), as a job writes it."""
    from procexec.inference.store import Store

    store = Store(folder, "1-of-1", commit_records=1)
    for n, (finish, attempt) in enumerate([("stop", 1), ("length", 1), ("stop", 2)]):
        store.put(f"{n:064x}", {"id": f"add_int_1-10_k1:5:{n}", "attempt": attempt, "text": "t" * 20,
                                "num_generated_tokens": 20, "finish_reason": finish, "token_ids": list(range(20)),
                                "token_offsets": list(range(20)), "provenance": {"loop": None}})
    store.close()


def _index() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        _store_files(Path(folder))
        return (Path(folder) / "1-of-1.idx").read_bytes()


def _index_command(path: Path, work: Path) -> list:
    """status reads the store's index (and only checks the frames' extent in the segment)."""
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**RAW, "run_models": [KEY]}))
    store = work / "results" / "generations" / KEY / "store"
    if not store.exists():
        _store_files(store)
        (store / "1-of-1.idx").unlink()
        (store / "1-of-1.idx").symlink_to(path)
    return ["status", "--config", config, "--results", work / "results", "--json"]


def _merged() -> bytes:
    from procexec.cluster.workflow import merged_config_text

    raw = copy.deepcopy(RAW)
    raw["inference"]["top_p"] = 1e-05
    raw["run_models"] = [KEY]
    return merged_config_text(raw).encode()


def _walk(obj: Any, path: list | None = None) -> list[tuple[list, Any]]:
    path = path or []
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _walk(v, [*path, k])] or [(path, obj)]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _walk(v, [*path, i])] or [(path, obj)]
    return [(path, obj)]


FORMATS = {
    "model lock (check-config)": Format("lock", "models.lock.yaml", _lock, _lock_command, _walk,
                                        lambda b: yaml.safe_load(b), lambda d: yaml.safe_dump(d).encode()),
    "benchmark TSV (status --json)": Format("tsv", "1-of-1.tsv", _tsv, _status_command),
    "store index (status --json)": Format("idx", "1-of-1.idx", _index, _index_command),
    "merged config JSON (check-config)": Format("merged", "merged.json", _merged,
                                                lambda path, work: ["check-config", path], _walk,
                                                json.loads, lambda d: json.dumps(d).encode()),
}


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith((".tmp", ".part"))]


def check_contract(fmt: Format, data: bytes, work: Path) -> int:
    """Run ``fmt``'s command on ``data``; assert the contract; return the exit code."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / fmt.filename
    path.write_bytes(data)
    code, out, err = run(fmt.command(path, work))
    assert code in (0, 2), (code, err[-2000:])
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("procexec "), err
        assert ": error: " in lines[0]
        assert str(path) in lines[0] or path.name in lines[0], lines[0]  # it names the file
        assert out == ""
    else:
        assert "NaN" not in out and "Infinity" not in out  # what a reader prints is strict
    assert path.read_bytes() == data  # the input is never touched
    assert not _leftovers(work), _leftovers(work)
    return code


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_the_valid_file_passes(fmt, tmp_path):
    assert check_contract(fmt, fmt.valid(), tmp_path) == 0


OTHER_TYPES = [None, True, -1, 1.5, float("nan"), "text", "", [], {}, [1, "x"], {"a": None}, 10**30]


@pytest.mark.parametrize("fmt", [f for f in FORMATS.values() if f.fields], ids=[k for k, f in FORMATS.items() if f.fields])
def test_a_wrong_type_in_any_field_keeps_the_contract(fmt, tmp_path):
    document = fmt.parse(fmt.valid())
    refused = 0
    for number, (path, value) in enumerate(fmt.fields(document)):
        for other in OTHER_TYPES:
            if type(other) is type(value) and other == value:
                continue
            spoilt = copy.deepcopy(document)
            target = spoilt
            for part in path[:-1]:
                target = target[part]
            if not path:
                continue
            target[path[-1]] = other
            try:
                data = fmt.dump(spoilt)
            except ValueError:
                continue
            refused += check_contract(fmt, data, tmp_path / f"{number}-{OTHER_TYPES.index(other)}") == 2
    assert refused > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_byte_level_corruption_keeps_the_contract(fmt, data, tmp_path_factory):
    valid = fmt.valid()
    kind = data.draw(st.sampled_from(["truncate", "flip", "drop", "insert", "nan", "foreign"]))
    at = data.draw(st.integers(0, len(valid) - 1))
    if kind == "truncate":
        spoilt = valid[:at]
    elif kind == "flip":  # the same size, another byte
        spoilt = valid[:at] + bytes([valid[at] ^ data.draw(st.integers(1, 255))]) + valid[at + 1:]
    elif kind == "drop":
        spoilt = valid[:at] + valid[at + 1:]
    elif kind == "insert":
        spoilt = valid[:at] + data.draw(st.binary(min_size=1, max_size=4)) + valid[at:]
    elif kind == "nan":  # a number replaced by a non-finite one
        import re

        numbers = [m for m in re.finditer(rb"-?[0-9]+(\.[0-9]+)?", valid)]
        nan = data.draw(st.sampled_from([b"NaN", b"nan", b".nan", b"inf", b"-Infinity"]))
        if numbers:
            m = numbers[at % len(numbers)]
            spoilt = valid[:m.start()] + nan + valid[m.end():]
        else:  # a binary format: a float64 NaN or infinity written over 8 bytes
            import struct

            value = struct.pack("<d", float(nan.decode().lstrip(".")))
            start = min(at, len(valid) - 8)
            spoilt = valid[:start] + value + valid[start + 8:]
    else:  # another format's valid file: well formed, but foreign
        others = [f for f in FORMATS.values() if f is not fmt]
        spoilt = data.draw(st.sampled_from(others)).valid()
    check_contract(fmt, spoilt, tmp_path_factory.mktemp(fmt.name))

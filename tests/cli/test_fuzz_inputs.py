"""A fuzz test per input format, driving the real command that reads it (issue 22).

Each format is one ``Format``: a generator of a valid file, the command that
reads it, the fields a wrong-type or missing-key mutation may hit, and the
mutations only it has.  Every mutation (truncation, wrong type per field, a
key missing, NaN, same-size corruption, a byte more or less, foreign but
well-formed data) must end in the contract -- exit 2, one line ``procexec CMD:
error: ...`` naming the file (an endpoint's reply: its URL) and, where the
format says so, the field; no traceback, the input untouched, no temporary
left, and nothing lost (``after``: an endpoint's store then completes with
every example once) -- or in a success the command is entitled to (a mutation
that left a valid file).  A new format joins by adding its ``Format``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runs import procexec_in_process
from procexec.config.speculative import PILOT_NGRAM
from snakemake_dry_runs import LINKED

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "config.yaml").read_text())
KEY = "qw-4"


def run(argv: list) -> tuple[int, str, str]:
    """The command in this process (tests/cli_runs.py)."""
    done = procexec_in_process(*argv)
    return done.returncode, done.stdout, done.stderr


@dataclass
class Format:
    name: str
    filename: str
    valid: Callable[[], bytes]  # a valid file's bytes
    command: Callable[[Path, Path], list]  # (the file, a work folder) -> argv of the command that reads it
    fields: Callable[[Any], list[tuple[list, Any]]] | None = None  # (path, value) pairs of the parsed document
    parse: Callable[[bytes], Any] | None = None
    dump: Callable[[Any], bytes] | None = None
    mutations: Callable[[Any], list[tuple[str, Any]]] | None = None  # named spoilt documents only this format has
    names: Callable[[Path], str] | None = None  # what a refusal names when it is not the file (a URL)
    after: Callable[[Path, Path, str], None] | None = None  # (the file, the work folder, refusal): nothing lost
    fields_named: bool = False  # a refusal of a wrong or missing field names it (a.b.0.c)


def _lock() -> bytes:
    entry = {
        "hf_id": RAW["models"][KEY]["hf_id"],
        "revision": RAW["models"][KEY].get("revision", "main"),
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "generation": 1,
        "locked_utc": "2026-01-01T00:00:00Z",
    }
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
    from procexec.generation.store import Store

    store = Store(folder, "1-of-1", commit_records=1)
    for n, (finish, attempt) in enumerate([("stop", 1), ("length", 1), ("stop", 2)]):
        store.put(
            f"{n:064x}",
            {
                "id": f"add_int_1-10_k1:5:{n}",
                "length": 5,
                "attempt": attempt,
                "text": "t" * 20,
                "num_generated_tokens": 20,
                "finish_reason": finish,
                "token_ids": list(range(20)),
                "token_offsets": list(range(20)),
                "provenance": {"loop": None},
            },
        )
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


def _segment() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        _store_files(Path(folder))
        return (Path(folder) / "1-of-1.seg").read_bytes()


def _measured_command(path: Path, work: Path) -> list:
    """cost --measured decodes every record of the store (an index naming frames in ``path``)."""
    store = work / "results" / "generations" / "tiny-llama" / "store"
    if not store.exists():
        _store_files(store)
        (store / "1-of-1.seg").unlink()
        (store / "1-of-1.seg").symlink_to(path)
    return [
        "cost",
        "--config",
        ROOT / "config.yaml",
        ROOT / "config" / "test-tiny.yaml",
        "--measured",
        work / "results",
    ]


def _stats() -> bytes:
    return b'{"accepted_tokens": 30, "decoded_tokens": 1000, "draft_tokens": 60, "drafts": 20, "generate_s": 12.5}\n'


def _stats_command(path: Path, work: Path) -> list:
    """status reads each shard's engine statistics (a file it leaves out is a warning, never a NaN or a frame)."""
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**RAW, "run_models": [KEY]}))
    target = work / "results" / "generations" / KEY / "store" / "stats" / "1-of-1.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.is_symlink():
        target.symlink_to(path)
    return ["status", "--config", config, "--results", work / "results", "--json"]


def _merged() -> bytes:
    """config.yaml as the workflow merges it, for one model, its suite cut to one dataset per family (each list
    its first item, every field still there: 12 missing keys fewer, the other input ranges'): a DAG built from it
    holds 25 jobs, not 184."""
    from procexec.cluster.workflow import merged_config_text

    raw = copy.deepcopy(RAW)
    raw["inference"]["top_p"] = 1e-05
    raw["run_models"] = [KEY]
    suite = raw["suite"]
    suite["inputs"] = suite["inputs"][:1]
    for family in suite["families"].values():
        family.update(operators=family["operators"][:1], lookbacks=family["lookbacks"][:1])
    return merged_config_text(raw).encode()


#: Nested values no field type sees into, and integral floats where an integer is meant (issue 30): check-config
#: must refuse each in one line.
NESTED_MUTATIONS = [
    (["models", "ds-685", "serve_args"], ["--data-parallel-size", "0"]),
    (["models", "ds-685", "serve_args"], ["--max-num-seqs", "many"]),
    (["models", "ds-685", "serve_args"], ["--tensor_parallel_size", "8"]),
    (["models", "ds-685", "serve_args"], ["--max-model", "32k"]),
    # the underscore and "=" forms as vLLM reads them (16 alone is a layout of its own now: planned models are
    # pinned by a data-parallel size, and 16 x TP1 fits two H200 nodes)
    (["models", "ds-685", "serve_args"], ["--data_parallel_size=0"]),
    (["models", "ds-685", "serve_args"], ["--max", "3"]),
    (["models", "ds-685", "request_extra"], {"max_tokens": 2, "temperature": 0.9, "stop": ["x"]}),
    (["models", "qw-4", "speculative_config"], {"method": "ngram-fast", "num_speculative_tokens": 3}),
    (["models", "qw-4", "speculative_config"], {"method": "ngram", "num_speculative_tokens": 2.5}),
    (["inference", "rerun_repetition_guard"], {"max_pattern_size": 4, "min_pattern_size": 8, "min_count": 3}),
    (["pilot_examples_per_length"], 2.0),  # JSON Schema counts 2.0 as an integer; the typed config does not
    (["inference", "max_new_tokens"], 384.0),
    # issue 38.5: a range vLLM states, a relation its SpeculativeConfig checks, a watchdog, a home no shell knows
    (["models", "ds-685", "serve_args"], ["--stream-interval", "0"]),
    (["models", "qw-4", "speculative_config"], {**PILOT_NGRAM, "prompt_lookup_min": 6, "prompt_lookup_max": 2}),
    (["pilot_speculative"], {**PILOT_NGRAM, "prompt_lookup_min": 6, "prompt_lookup_max": 2}),
    (["inference", "stall_timeout_s"], 1e-9),
    (["cluster", "cache_dir"], "~no-such-user-38/caches"),
]


def _nested_mutations(document: dict) -> list[tuple[str, Any]]:
    return [(f"{_dotted(path)} = {value!r}", _spoilt(document, path, value)) for path, value in NESTED_MUTATIONS]


def _walk(obj: Any, path: list | None = None, first: bool = False) -> list[tuple[list, Any]]:
    """(path, value) of every leaf; ``first``: of a list's first item only (where its items are alike)."""
    path = path or []
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _walk(v, [*path, k], first)] or [(path, obj)]
    if isinstance(obj, list):
        items = obj[:1] if first else obj
        return [p for i, v in enumerate(items) for p in _walk(v, [*path, i], first)] or [(path, obj)]
    return [(path, obj)]


def _config_fields(document: Any) -> list[tuple[list, Any]]:
    """Every field of a config once: a list's first item (its items are alike) and each model field in the
    first model that has it, the models the config runs first (every entry is read through the same schema and
    rules, and a run model's through the DAG's input functions too); 4x fewer runs."""
    models = document.get("models") or {}
    run = [key for key in document.get("run_models") or [] if key in models]
    document = {**document, "models": {**{key: models[key] for key in run}, **models}}
    seen: set[tuple] = set()
    fields = []
    for path, value in _walk(document, first=True):
        kind = tuple("*" if i == 1 and path[0] == "models" else part for i, part in enumerate(path))
        if kind not in seen:
            seen.add(kind)
            fields.append((path, value))
    return fields


# --------------------------------------------------------------------------- harness logs

LM_EVAL_SAMPLES = ROOT / "tests" / "data" / "harness" / "lm-eval" / "samples_procexec_add_int_1-10_k1.jsonl"
HARNESS_MODEL = "smollm2-135m-instruct"


def _lm_eval_sample() -> bytes:
    """A real lm-eval 0.4.13 sample of procexec's task (tests/data/harness), one line."""
    return LM_EVAL_SAMPLES.read_bytes().splitlines(keepends=True)[0]


def _lm_eval_command(path: Path, work: Path) -> list:
    """import-harness reads the samples file as a typed format; a one-model JSON config, quick to read."""
    config = work / "config.json"
    if not config.exists():
        config.write_text(
            json.dumps({**RAW, "models": {HARNESS_MODEL: RAW["models"][HARNESS_MODEL]}, "run_models": [HARNESS_MODEL]})
        )
    return ["import-harness", "--lm-eval", path, "--config", config, "--model", HARNESS_MODEL, "--out", work / "out"]


def _lm_eval_fields(document: dict) -> list[tuple[list, Any]]:
    """The fields import-harness reads: the row (a list's first item), the text, the logged request."""
    return [(path, value) for path, value in _walk(document, first=True) if path[0] in ("doc", "resps", "arguments")]


def _lm_eval_mutations(document: dict) -> list[tuple[str, Any]]:
    """Issue 38.2's cases: the input as a word or null, resps as a mapping, a bare string or a flat list, and
    the arguments in lm-eval's older list layout (read as 0.4.13 sanitises it)."""
    request = document["arguments"]["gen_args_0"]
    cases = [
        ("doc.x: text", ["doc", "x"], "twelve"),
        ("doc.x: null", ["doc", "x"], None),
        ("resps: a mapping", ["resps"], {"0": ["A"]}),
        ("resps: a string", ["resps"], "Answer"),
        ("resps: a flat list", ["resps"], ["Answer"]),
        ("resps: two generations", ["resps"], [["A", "B"]]),
        ("arguments: the older list layout", ["arguments"], [[request["arg_0"], request["arg_1"]]]),
    ]
    return [(name, _spoilt(document, path, value)) for name, path, value in cases]


# --------------------------------------------------------------------------- the manifest's and endpoints' world

#: What the manifest and endpoint formats read besides their file: the session's tiny Llama, a dataset, a server.
SHARED: dict[str, Any] = {}
TINY = {
    "abbrev": "TINY",
    "hf_id": "procexec/tiny-llama",
    "revision": "seed-0",
    "source": "tiny-llama",
    "gpus": 0,
    "shards": 1,
    "tensor_parallel_size": 1,
    "max_model_len": 768,
    "max_context": 768,
}
EXAMPLE = "add_int_1-10_k1:5:0"
EXAMPLES = 2  # in the endpoint formats' dataset
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def _shared(tiny_manifest, tmp_path_factory):
    """The tiny Llama (built once per session), a dataset of ``EXAMPLES`` examples, the fake endpoint."""
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.io.jsonl import write_jsonl

    directory = tmp_path_factory.mktemp("fuzz-datasets")
    spec = DatasetSpec.from_id(EXAMPLE.split(":")[0])
    write_jsonl(
        directory / f"{spec.id}.jsonl",
        (e.to_json() for e in generate_dataset(spec, lengths=(5,), examples_per_length=EXAMPLES, seed=1)),
    )
    SHARED.update(manifest=tiny_manifest, datasets=(directory, [spec.id]))
    with ReplyServer() as server, pytest.MonkeyPatch.context() as patch:
        patch.setattr("procexec.generation.backends.openai.BACKOFF_BASE_S", 0.0)  # a retry waits for nothing
        SHARED["server"] = server
        yield


def _config(work: Path, key: str, model: dict) -> Path:
    """The repository's config with one model only (quicker to read, for many runs); tiny budgets.  Written as
    JSON, which a config file may be (and which is quicker to write and read than YAML)."""
    raw = {**copy.deepcopy(RAW), "models": {key: model}, "run_models": [key]}
    raw["inference"].update(max_new_tokens=MAX_NEW_TOKENS, truncation_rerun="off")
    path = work / "config.yaml"
    path.write_text(json.dumps(raw))
    return path


# --------------------------------------------------------------------------- the model manifest


def _manifest() -> bytes:
    return SHARED["manifest"].read_bytes()


def _manifest_command(path: Path, work: Path) -> list:
    """show-prompt, the cheapest reader of --manifest: it checks the snapshot the manifest lists, then loads
    the tokenizer from it (``hf/`` beside the manifest, as prepare-model writes it)."""
    if not (work / "hf").exists():
        (work / "hf").symlink_to(SHARED["manifest"].parent / "hf")
    return [
        "show-prompt",
        "--config",
        _config(work, "tiny", TINY),
        "--model",
        "tiny",
        "--example",
        EXAMPLE,
        "--manifest",
        path,
        "--json",
    ]


def _manifest_fields(document: dict) -> list[tuple[list, Any]]:
    """Every field, the files' only for ``config.json`` (every listed file is checked alike)."""
    return [(path, value) for path, value in _walk(document) if path[0] != "files" or path[1] == "config.json"]


def _manifest_mutations(document: dict) -> list[tuple[str, Any]]:
    """What a wrong type cannot say: another hash at the same size, a size a byte off, a folder that is not
    the model's, another model's manifest or version, no file or one outside the folder."""
    out = []
    for name, meta in document["files"].items():
        other = copy.deepcopy(document)
        other["files"][name]["sha256"] = format(int(meta["sha256"], 16) ^ 1, "064x")
        out.append((f"{name}: another sha256", other))
        other = copy.deepcopy(document)
        other["files"][name]["size"] = meta["size"] + 1
        out.append((f"{name}: a byte more", other))
    elsewhere = {"../config.json": {"size": 1, "sha256": "0" * 64}}
    for name, value in [
        ("model_dir", "/"),
        ("model_dir", "../hf"),
        ("model_dir", ""),
        ("model", "other"),
        ("manifest_version", 1),
        ("files", {}),
        ("files", elsewhere),
    ]:
        out.append((f"{name}: {value!r}", {**copy.deepcopy(document), name: value}))
    return out


# --------------------------------------------------------------------------- endpoint replies


class ReplyServer:
    """A fake OpenAI-compatible endpoint for every endpoint example at once.

    Under ``/<n>/v1`` it answers the first ``spoil`` requests of reply file n's kind (models, completions,
    chat) with the file's bytes, every other request with that kind's healthy reply (``HEALTHY``); as plain
    JSON, or, when a POST asks ``stream: true``, as one SSE chunk carrying the same payload (a chat choice's
    ``message`` as its ``delta``) then ``data: [DONE]``.
    """

    def __init__(self):
        import http.server
        import threading

        self.prefixes: dict[Path, str] = {}
        self.routes: dict[str, dict[str, Any]] = {}
        routes = self.routes

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # TCP_NODELAY, as vLLM's server: else each reply waits 40 ms

            def log_message(self, *args):
                pass

            def _answer(self, body: bytes):
                prefix, _, rest = self.path.strip("/").partition("/")
                kind = {"v1/models": "models", "v1/completions": "completions", "v1/chat/completions": "chat"}[rest]
                route = routes[prefix]
                data = HEALTHY[kind]()
                if kind == route["kind"] and route["spoil"] > 0:
                    route["spoil"] -= 1
                    data = route["file"].read_bytes()
                try:
                    stream = json.loads(body).get("stream") is True
                except (ValueError, AttributeError):
                    stream = False
                if stream:
                    data = b"data: " + _as_chunk(data).replace(b"\n", b" ") + b"\n\ndata: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(b"")

            def do_POST(self):
                self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: Path) -> str:
        """The base URL that serves reply file ``path``."""
        prefix = self.prefixes.setdefault(path, str(len(self.prefixes)))
        return f"http://127.0.0.1:{self.server.server_address[1]}/{prefix}/v1"

    def serve(self, path: Path, kind: str, spoil: int = 1) -> str:
        """``url(path)``, which from now on answers ``kind``'s first ``spoil`` requests with the file."""
        url = self.url(path)
        self.routes[self.prefixes[path]] = {"file": path, "kind": kind, "spoil": spoil}
        return url

    def __enter__(self) -> ReplyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _as_chunk(data: bytes) -> bytes:
    """A reply as a stream's chunk: a chat choice's ``message`` becomes its ``delta`` (anything else as it is)."""
    try:
        reply = json.loads(data)
    except ValueError:
        return data
    choices = reply.get("choices") if isinstance(reply, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and "message" in choice:
            choice["delta"] = choice.pop("message")
    return json.dumps(reply).encode()


def _reply(**fields) -> Callable[[], bytes]:
    """A healthy reply of the tiny model's server: the fields procexec reads, one choice."""
    choice = fields.pop("choice")
    return lambda: json.dumps({"model": "tiny", **fields, "choices": [{**choice, "finish_reason": "stop"}]}).encode()


HEALTHY = {  # the replies' common fields (system_fingerprint, usage) once each: read by the same models
    "completions": _reply(system_fingerprint="fake", choice={"text": "5", "token_ids": [60, 61]}),
    "chat": _reply(
        usage={"prompt_tokens": 600, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 512}},
        choice={
            "message": {"content": "<a>"},
            "logprobs": {"content": [{"token": "<", "bytes": [60]}, {"token": "a>", "bytes": [97, 62]}]},
        },
    ),
    "models": lambda: json.dumps({"data": [{"id": "tiny", "max_model_len": 2048}, {"id": "other"}]}).encode(),
}


def _infer(work: Path, base_url: str, kind: str, retries: int) -> list:
    """procexec infer of the endpoint model (the tiny Llama's tokenizer, served as ``tiny``), one at a time."""
    model = {
        **TINY,
        "source": "path",
        "path": str(SHARED["manifest"].parent / "hf"),
        "backend": "openai",
        "base_url": base_url,
        "served_model": "tiny",
        "openai_api": "chat" if kind == "chat" else "completions",
        "max_concurrency": 1,
        "request_timeout_s": 10,
        "max_retries": retries,
    }
    directory, ids = SHARED["datasets"]
    return [
        "infer",
        "--config",
        _config(work, "endpoint", model),
        "--model",
        "endpoint",
        "--datasets-dir",
        directory,
        "--datasets",
        *ids,
        "--store",
        work / "store",
        "--out",
        work / "shard.jsonl.gz",
        "--no-progress",
    ]


def _endpoint_after(kind: str) -> Callable[[Path, Path, str], None]:
    """Nothing lost: after a reply refused as malformed, a run allowed one retry takes the healthy reply
    that follows; after any other refusal, a run against a healthy server completes.  Either way every
    example is in the store exactly once, as an entry a reader accepts, within the run's budgets."""
    from procexec.io.jsonl import read_jsonl
    from procexec.records import GenerationRecord
    from store_view import stored_keys, stored_records

    def after(path: Path, work: Path, refusal: str) -> None:
        server = SHARED["server"]
        if "still failing after 0 retries" in refusal:
            code, _, err = run(_infer(work, server.serve(path, kind), kind, retries=1))
            assert code == 0 and "retry 1/1" in err, err[-2000:]
        elif refusal:
            code, _, err = run(_infer(work, server.serve(path, kind, spoil=0), kind, retries=0))
            assert code == 0, err[-2000:]
        keys = stored_keys(work / "store")
        assert len(keys) == len(set(keys)) == EXAMPLES
        for key, record in stored_records(work / "store").items():  # as a reader takes it, within the budgets
            GenerationRecord.from_json(record, key)
            assert record["num_generated_tokens"] <= MAX_NEW_TOKENS, record
            assert record["prompt_tokens"] <= TINY["max_model_len"], record
        assert len(list(read_jsonl(work / "shard.jsonl.gz"))) == EXAMPLES

    return after


def _endpoint_format(kind: str) -> Format:
    return Format(
        f"endpoint-{kind}",
        f"{kind}.json",
        HEALTHY[kind],
        lambda path, work: _infer(work, SHARED["server"].serve(path, kind), kind, retries=0),
        lambda d: _walk(d, first=True),
        json.loads,
        lambda d: json.dumps(d).encode(),
        _reply_mutations,
        names=lambda path: SHARED["server"].url(path),
        after=_endpoint_after(kind),
        fields_named=kind != "models",
    )  # a model list's refusal names the served models, not a field


def _reply_mutations(document: Any) -> list[tuple[str, Any]]:
    """A proxy's or a provider's faults a wrong type cannot say."""
    out = [("a list of it", [document]), ("empty", {}), ("an error object", {"error": {"message": "overloaded"}})]
    if "choices" in document:
        choice = document["choices"][0]
        out += [
            ("no choices", {**document, "choices": []}),
            ("choices of strings", {**document, "choices": ["x"]}),
            ("another model", {**document, "model": "gpt-17"}),
            ("two choices", {**document, "choices": [choice, choice]}),
            ("cut by the server", {**document, "choices": [{**choice, "finish_reason": "length"}]}),
            ("usage above the budget", {**document, "usage": {"prompt_tokens": 600, "completion_tokens": 5000}}),
            (
                "more cached tokens than the prompt",
                {**document, "usage": {"prompt_tokens": 600, "prompt_tokens_details": {"cached_tokens": 601}}},
            ),
        ]
    if "token_ids" in document.get("choices", [{}])[0]:
        out += [
            ("a token outside the vocabulary", {**document, "choices": [{**choice, "token_ids": [60, 10**9]}]}),
            ("no token ids", {**document, "choices": [{**choice, "token_ids": []}]}),
            ("more token ids than asked", {**document, "choices": [{**choice, "token_ids": [60] * 100}]}),
        ]
    if "message" in document.get("choices", [{}])[0]:
        out += [
            (
                "a reasoning parser on",
                {**document, "choices": [{**choice, "message": {**choice["message"], "reasoning_content": "think"}}]},
            ),
            (
                "bytes out of range",
                {**document, "choices": [{**choice, "logprobs": {"content": [{"token": "x", "bytes": [256]}]}}]},
            ),
        ]
    if "data" in document:
        out += [
            ("another model served", {"object": "list", "data": [{"id": "gpt-17"}]}),
            ("a shorter context", {"data": [{"id": "tiny", "max_model_len": 100}]}),
            ("no model", {"data": []}),
        ]
    return out


FORMATS = {
    "model lock (check-config)": Format(
        "lock",
        "models.lock.yaml",
        _lock,
        _lock_command,
        _walk,
        lambda b: yaml.safe_load(b),
        lambda d: yaml.safe_dump(d).encode(),
    ),
    "benchmark TSV (status --json)": Format("tsv", "1-of-1.tsv", _tsv, _status_command),
    "store index (status --json)": Format("idx", "1-of-1.idx", _index, _index_command),
    "store segment (cost --measured)": Format("seg", "1-of-1.seg", _segment, _measured_command),
    "engine statistics (status --json)": Format("stats", "1-of-1.json", _stats, _stats_command),
    "merged config JSON (check-config)": Format(
        "merged",
        "merged.json",
        _merged,
        lambda path, work: ["check-config", path],
        _config_fields,
        json.loads,
        lambda d: json.dumps(d).encode(),
        _nested_mutations,
    ),
    "model manifest (show-prompt --manifest)": Format(
        "manifest",
        "manifest.json",
        _manifest,
        _manifest_command,
        _manifest_fields,
        json.loads,
        lambda d: json.dumps(d).encode(),
        _manifest_mutations,
        fields_named=True,
    ),
    "lm-eval sample (import-harness)": Format(
        "lm-eval",
        "samples_procexec_add_int_1-10_k1.jsonl",
        _lm_eval_sample,
        _lm_eval_command,
        _lm_eval_fields,
        json.loads,
        lambda d: json.dumps(d).encode() + b"\n",
        _lm_eval_mutations,
        fields_named=True,
    ),
    "completions reply (infer, openai)": _endpoint_format("completions"),
    "chat reply (infer, openai)": _endpoint_format("chat"),
    "model list (infer, openai)": _endpoint_format("models"),
}


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith((".tmp", ".part"))]


def refused(out: str, err: str, named: list[str]) -> str:
    """The one error line of a refusal, which names one of ``named`` (the file, or the URL)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("procexec "), err
    assert ": error: " in lines[0]
    assert any(n in lines[0] for n in named), (named, lines[0])
    assert out == ""
    return lines[0]


def check_contract(fmt: Format, data: bytes, work: Path, field: str | None = None) -> int:
    """Run ``fmt``'s command on ``data``; assert the contract (a refusal names ``field``, the one spoilt, where
    the format names fields); return the exit code."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / fmt.filename
    path.write_bytes(data)
    code, out, err = run(fmt.command(path, work))
    assert code in (0, 2), (code, err[-2000:])
    assert "Traceback" not in err
    refusal = ""
    if code == 2:
        refusal = refused(out, err, [fmt.names(path)] if fmt.names else [str(path), path.name])
        streamed = (field or "").replace(".message", ".delta")  # the same field in a stream's chunk (ReplyServer)
        assert not (fmt.fields_named and field) or field in refusal or streamed in refusal, (field, refusal)
    else:
        assert "NaN" not in out and "Infinity" not in out  # what a reader prints is strict
    assert path.read_bytes() == data  # the input is never touched
    assert not _leftovers(work), _leftovers(work)
    if fmt.after:
        fmt.after(path, work, refusal)
    return code


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_the_valid_file_passes(fmt, tmp_path):
    assert check_contract(fmt, fmt.valid(), tmp_path) == 0


def checked(fmt: Format, what: str, data: bytes, work: Path, field: str | None = None) -> int:
    """``check_contract``, a failure naming the mutation."""
    try:
        return check_contract(fmt, data, work, field)
    except AssertionError as exc:
        raise AssertionError(f"{fmt.name}, {what}: {exc}") from None


def _spoilt(document: Any, path: list, value: Any = None, delete: bool = False) -> Any:
    """A deep copy of ``document`` with the field at ``path`` set to ``value`` (or deleted)."""
    spoilt = copy.deepcopy(document)
    target = spoilt
    for part in path[:-1]:
        target = target[part]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return spoilt


OTHER_TYPES = [None, True, -1, 1.5, float("nan"), "text", "", [], {}, [1, "x"], {"a": None}, 10**30]


def _dotted(path: list) -> str:
    return ".".join(str(part) for part in path)


def wrong_types(fmt: Format) -> Iterator[tuple[str, bytes, str | None]]:
    """Every field set to each value of another type (that the format can write)."""
    document = fmt.parse(fmt.valid())
    for path, value in fmt.fields(document):
        for other in OTHER_TYPES:
            if not path or (type(other) is type(value) and other == value):
                continue
            try:
                data = fmt.dump(_spoilt(document, path, other))
            except ValueError:
                continue
            yield f"{path} = {other!r}", data, None if other != other else _dotted(path)  # NaN: not JSON at all


def _keys(obj: Any, path: list | None = None) -> list[list]:
    """The path of every key of every mapping in ``obj``."""
    path = path or []
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in [[*path, k], *_keys(v, [*path, k])]]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _keys(v, [*path, i])]
    return []


def missing_keys(fmt: Format) -> Iterator[tuple[str, bytes, str | None]]:
    """Every key of every mapping deleted, one at a time."""
    document = fmt.parse(fmt.valid())
    for path in _keys(document):
        yield f"{path} deleted", fmt.dump(_spoilt(document, path, delete=True)), _dotted(path)


def own_mutations(fmt: Format) -> Iterator[tuple[str, bytes, str | None]]:
    for name, spoilt in fmt.mutations(fmt.parse(fmt.valid())):
        yield name, fmt.dump(spoilt), None


def _fuzz(fmt: Format, mutations: Callable[[Format], Iterator[tuple[str, bytes, str | None]]], work: Path) -> list[int]:
    """The contract kept by every mutation; their exit codes."""
    return [
        checked(fmt, what, data, work / str(number), field) for number, (what, data, field) in enumerate(mutations(fmt))
    ]


FIELDED = {name: fmt for name, fmt in FORMATS.items() if fmt.fields}


@pytest.mark.parametrize("fmt", FIELDED.values(), ids=FIELDED)
def test_a_wrong_type_in_any_field_keeps_the_contract(fmt, tmp_path):
    assert 2 in _fuzz(fmt, wrong_types, tmp_path)


@pytest.mark.parametrize("fmt", FIELDED.values(), ids=FIELDED)
def test_a_missing_key_keeps_the_contract(fmt, tmp_path):
    assert 2 in _fuzz(fmt, missing_keys, tmp_path)


@pytest.mark.parametrize(
    "fmt", [f for f in FORMATS.values() if f.mutations], ids=[k for k, f in FORMATS.items() if f.mutations]
)
def test_a_format_s_own_mutations_keep_the_contract(fmt, tmp_path):
    _fuzz(fmt, own_mutations, tmp_path)


def test_a_nested_value_vllm_or_the_job_would_refuse_is_refused(tmp_path):
    """The merged config's nested mutations are not merely survived: each is refused (exit 2) before any job."""
    assert _fuzz(FORMATS["merged config JSON (check-config)"], own_mutations, tmp_path) == [2] * len(NESTED_MUTATIONS)


# --------------------------------------------------------------------------- inspect logs (in the harness venv)

#: The fields of an inspect log import-harness reads besides the row's columns (the lm-eval format fuzzes those,
#: through the same reader): the task's arguments, the prompt the task sent, a value, an id and a trace.
INSPECT_FIELDS = [
    ["eval", "task_args", "model_dir"],
    ["eval", "task_args", "route"],
    *(["samples", 0, "metadata", name] for name in ("prompt_sha256", "prompt_token_ids", "x", "id", "trace")),
]


#: Another type for each of them (fewer than OTHER_TYPES: each run reads the whole log with inspect's reader).
INSPECT_OTHER_TYPES = [None, -1, "text", [1, "x"], {"a": None}]


def test_an_inspect_log_s_wrong_or_missing_fields_keep_the_contract(tmp_path):
    """import-harness --inspect on a real inspect_ai 0.3.285 log of procexec/procedural (one scripted sample, JSON
    format) with each field procexec reads set to another type, or deleted: exit 0, or one line naming the log and
    the field (or inspect's own refusal of a log its reader cannot read); never a frame.  One harness process
    runs them all."""
    from harness_fixtures import run_session

    mutations: list[dict[str, Any]] = [
        {"path": path, "value": other} for path in INSPECT_FIELDS for other in INSPECT_OTHER_TYPES
    ]
    mutations += [{"path": path, "delete": True} for path in INSPECT_FIELDS]
    token = ["samples", 0, "output", "choices", 0, "logprobs", "content", 0, "token"]
    mutations += [  # the output ids the text is spelled from: named by the sample (inspect types the rest)
        {"path": ["samples", 0, "output", "choices"], "value": [], "expect": "no output token ids"},
        {"path": token, "value": "token_id:x", "expect": "no output token ids"},
        {"path": token, "value": "token_id:99999999", "expect": "output token id 99999999 is outside the vocabulary"},
    ]
    model_dir = str(SHARED["manifest"].parent / "hf")
    dataset, example = EXAMPLE.split(":")[0], EXAMPLE
    out = tmp_path / "out"
    _, results = run_session(
        tmp_path,
        [
            {
                "kind": "inspect",
                "log_dir": str(tmp_path / "inspect"),
                "task_args": {
                    "model_dir": model_dir,
                    "datasets": [dataset],
                    "lengths": [5],
                    "examples_per_length": 1,
                    "route": "chat",
                },
                "scripted": {
                    example: {"text": "<answer>3</answer>", "completion": "<answer>3</answer>", "stop_reason": "stop"}
                },
            },
            {
                "kind": "mutated_log",
                "log": f"glob:{tmp_path}/inspect/*.json",
                "work": str(tmp_path / "mutated"),
                "mutations": mutations,
                "argv": [
                    "import-harness",
                    "--inspect",
                    "{log}",
                    "--config",
                    "config.yaml",
                    "--model",
                    HARNESS_MODEL,
                    "--out",
                    str(out),
                ],
            },
        ],
    )
    codes = []
    for mutation, result in zip(mutations, results, strict=True):
        what, err = mutation, result["stderr"]
        assert result["code"] in (0, 2) and "Traceback" not in err, (what, err[-2000:])
        codes.append(result["code"])
        assert result["code"] == 2 or "expect" not in mutation, (what, err)
        if result["code"] == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("procexec import-harness: error: "), (what, err)
            assert result["log"] in lines[0], (what, lines[0])
            field = ".".join(str(part) for part in mutation["path"] if part != 0).replace("samples.", "")
            named = mutation.get("expect", field)
            assert named in lines[0] or ("expect" not in mutation and "not an inspect log" in lines[0]), (
                what,
                lines[0],
            )
    assert codes.count(2) > len(codes) // 2
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == [f"{dataset}.jsonl.gz"]


# --------------------------------------------------------------------------- the workflow's dry runs

#: The study stages besides ``full`` (the merged config's own): each rewrites the config (procexec.cluster.study_stages).
OTHER_STAGES = ("pilot", "smoke")


def dry_runs(configs: list[str], work: Path) -> list[dict]:
    """``snakemake -n`` on each config text, by tests/snakemake_dry_runs.py in a process of its own (Snakemake's
    working folder, logging and caches never reach this one): per config its code, output and what it wrote."""
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "snakemake_dry_runs.py"), str(work)],
        input="".join(json.dumps(config) + "\n" for config in configs),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(runs) == len(configs), proc.stderr[-3000:]
    return runs


def assert_no_frame(what: str, run: dict) -> None:
    """Issue 30's contract for a dry run: the DAG built (0), or the workflow's one error line and exit 2; no
    Python frame anywhere; nothing written beside Snakemake's own .snakemake/.  And issue 38's: check-config's
    verdict on the same file is the workflow's, a refusal in the same words (but the preflight's, which names
    the file the workflow read: rules/preflight.smk)."""
    output, check = run["output"], run["check_config"]
    assert run["code"] in (0, 2) and 'File "' not in output and "Traceback" not in output, (what, output[-3000:])
    assert check["code"] == run["code"], (what, output[-1000:], check)
    if run["code"] == 2:
        lines = output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("procexec workflow: error: "), (what, output[-3000:])
        said = " ".join(lines[0].removeprefix("procexec workflow: error: ").split())
        assert said == check["error"] or said.startswith("/"), (what, said, check)
    assert run["written"] == [], (what, run["written"])


def _linked_files() -> dict[Path, tuple[int, int]]:
    """Size and modification time of each file of the checkout that a workflow copy links to."""
    return {
        path: (path.stat().st_size, path.stat().st_mtime_ns)
        for name in LINKED
        for path in [ROOT / name, *(ROOT / name).rglob("*")]
        if path.is_file()
    }


def _as_a_stage_reads_it(document: dict) -> dict:
    """``document`` less the entries of the models it does not run, which a stage's rewrite only validates."""
    run = document["run_models"] or document["models"]  # none: every model
    return {**document, "models": {key: document["models"][key] for key in run}}


def test_snakemake_dry_runs_of_every_config_mutation_print_no_python_frame(tmp_path):
    """Issue 30's acceptance through Snakemake itself: each mutation of the merged config (the wrong types, the
    missing keys, the nested values with every model run) as a workflow's config.yaml, a plain ``snakemake -n``
    (``--quiet`` skips the jobs' resource functions): the DAG builds, or the workflow stops in one line, exit 2;
    never a frame.  Each one that builds and changes what a stage reads (anything but a model it does not run)
    also goes through the pilot's and the smoke's rewrite, code the full stage never runs.

    A ``snakemake -n`` process costs 1.5-2.2 CPU s, mostly imports: 30 CPU minutes for all.  So one process runs
    them (tests/snakemake_dry_runs.py): a refusal in ~0.03 s, a built DAG in ~0.12 s, as the base's suite is cut
    to a dataset per family (25 jobs, not 184: 0.25 s).  Measured on the shared two-core box (``/usr/bin/time``
    of pytest, less a trivial test's 6 s): 1,079 mutations, 298 built and 781 refused, then 71 in two stages,
    in 72-76 CPU s and 76 s (the 18 dry runs and the in-process check it replaces: 27 CPU s); 62 s since each
    Snakefile is parsed once per text and serve_args once per list.  A second
    driver process gained no wall time there (the full stage's runs: 63.5 s in one, 64.5 s in two halves at
    once), and in CI the other worker holds the other core."""
    fmt = FORMATS["merged config JSON (check-config)"]
    mutations = []
    for kind in (wrong_types, missing_keys, own_mutations):
        for what, data, _ in kind(fmt):
            document = json.loads(data)
            if kind is own_mutations:  # the nested values of every model read, the servers' among them
                document["run_models"] = sorted(document["models"])
            mutations.append((what, document))
    linked = _linked_files()
    runs = dry_runs([json.dumps(document) for _, document in mutations], tmp_path / "full")
    for (what, _), run in zip(mutations, runs, strict=True):
        assert_no_frame(what, run)
    assert {run["code"] for run in runs} == {0, 2}
    base = _as_a_stage_reads_it(json.loads(fmt.valid()))
    staged = [
        (f"{what}, stage {stage}", {**document, "stage": stage})
        for (what, document), run in zip(mutations, runs, strict=True)
        if run["code"] == 0 and document.get("stage") == "full" and _as_a_stage_reads_it(document) != base
        for stage in OTHER_STAGES
    ]
    for (what, _), run in zip(staged, dry_runs([json.dumps(d) for _, d in staged], tmp_path / "stages"), strict=True):
        assert_no_frame(what, run)
    assert _linked_files() == linked


def _job_rules(output: str) -> set[str]:
    """The rules of a dry run's job table ("Job stats": one row per rule, then the total)."""
    table = output.split("Job stats:", 1)[1].split("total", 1)[0]
    return set(re.findall(r"^(\w+)\s+\d+$", table, flags=re.M))


def test_the_mutations_base_reaches_every_rule_the_study_does(tmp_path):
    """The merged config the mutations spoil is one model and a dataset per family: its DAG holds a job of every
    rule the shipped study's does, in every stage, so that each rule's input functions meet the mutations."""
    base = json.loads(FORMATS["merged config JSON (check-config)"].valid())
    shipped = yaml.safe_load((ROOT / "config.yaml").read_text())
    stages = ("full", *OTHER_STAGES)
    configs = [json.dumps({**shipped, "stage": stage}) for stage in stages]
    configs += [json.dumps({**base, "stage": stage}) for stage in stages]
    runs = dry_runs(configs, tmp_path / "work")
    assert [run["code"] for run in runs] == [0] * len(configs), runs[-1]["output"][-3000:]
    rules = [_job_rules(run["output"]) for run in runs]
    study, cut = rules[: len(stages)], rules[len(stages) :]
    assert all("infer" in r for r in study) and cut == study, list(zip(stages, study, cut))


def test_a_reply_that_says_more_was_cached_than_the_prompt_held_is_malformed(tmp_path):
    """``usage.prompt_tokens_details.cached_tokens`` feeds the records' ``num_cached_tokens`` and the shard's
    cached-prefill figure (which must stay within the prefill): a count above the prompt is no reply."""
    fmt = FORMATS["chat reply (infer, openai)"]
    document = json.loads(fmt.valid())
    document["usage"]["prompt_tokens_details"]["cached_tokens"] = 601
    path = tmp_path / fmt.filename
    path.write_text(json.dumps(document))
    code, out, err = run(fmt.command(path, tmp_path))
    assert code == 2 and "usage.prompt_tokens_details.cached_tokens: 601 of a prompt of 600 tokens" in err, err


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
        spoilt = valid[:at] + bytes([valid[at] ^ data.draw(st.integers(1, 255))]) + valid[at + 1 :]
    elif kind == "drop":
        spoilt = valid[:at] + valid[at + 1 :]
    elif kind == "insert":
        spoilt = valid[:at] + data.draw(st.binary(min_size=1, max_size=4)) + valid[at:]
    elif kind == "nan":  # a number replaced by a non-finite one
        import re

        numbers = [m for m in re.finditer(rb"-?[0-9]+(\.[0-9]+)?", valid)]
        nan = data.draw(st.sampled_from([b"NaN", b"nan", b".nan", b"inf", b"-Infinity"]))
        if numbers:
            m = numbers[at % len(numbers)]
            spoilt = valid[: m.start()] + nan + valid[m.end() :]
        else:  # a binary format: a float64 NaN or infinity written over 8 bytes
            import struct

            value = struct.pack("<d", float(nan.decode().lstrip(".")))
            start = min(at, len(valid) - 8)
            spoilt = valid[:start] + value + valid[start + 8 :]
    else:  # another format's valid file: well formed, but foreign
        others = [f for f in FORMATS.values() if f is not fmt]
        spoilt = data.draw(st.sampled_from(others)).valid()
    check_contract(fmt, spoilt, tmp_path_factory.mktemp(fmt.name))

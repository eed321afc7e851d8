"""The backend registry (procexec.generation.backends): real imports inside lazy factories.

Every kind a config may name resolves, through its factory's import statement, to a concrete ``Backend``
subclass; the import graph holds each of those edges; and an endpoint model's backend is created and opened
without vLLM or torch ever being imported.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import grimp

from procexec.config.model import VARIANTS, ImportedModel
from procexec.generation.backend import Backend
from procexec.generation.backends import REGISTRY

REPO = Path(__file__).resolve().parents[2]


def _backend_kinds(node: Any) -> set[str]:
    """Every value the config schema allows for a model's ``backend`` (an enum, or one const per variant)."""
    kinds: set[str] = set()
    if isinstance(node, dict):
        allowed = node.get("properties", {}).get("backend", {})
        kinds |= set(allowed.get("enum", [])) | ({allowed["const"]} if "const" in allowed else set())
        for value in node.values():
            kinds |= _backend_kinds(value)
    elif isinstance(node, list):
        for value in node:
            kinds |= _backend_kinds(value)
    return kinds


def test_every_kind_a_config_may_name_is_a_concrete_backend_the_import_graph_sees():
    """Every kind that generates here; an imported model's records come from a harness's logs (no backend)."""
    schema = json.loads(resources.files("procexec").joinpath("schemas/config.schema.json").read_text())
    assert {v.backend_kind for v in VARIANTS} == _backend_kinds(schema)
    assert (
        set(REGISTRY)
        == {v.backend_kind for v in VARIANTS if v.generates_here}
        == _backend_kinds(schema) - {ImportedModel.backend_kind}
    )
    graph = grimp.build_graph("procexec", cache_dir=None)  # no .grimp_cache in the checkout
    imported = graph.find_modules_directly_imported_by("procexec.generation.backends")
    for kind, factory in REGISTRY.items():
        backend_class = factory()
        assert isinstance(backend_class, type) and issubclass(backend_class, Backend), kind
        assert not inspect.isabstract(backend_class), f"{kind}: {backend_class.__abstractmethods__}"
        assert backend_class.__module__ in imported, kind


# A chat-route endpoint (the server renders the prompt: no tokenizer here) that answers its model list.
_ENDPOINT_SCRIPT = """
import http.server, json, sys, threading

class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "served", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
threading.Thread(target=server.serve_forever, daemon=True).start()

from procexec.config import prepare
from procexec.generation.backends import create_backend
from procexec.generation.job_settings import JobSettings

raw = json.loads(sys.argv[1])
raw["models"]["endpoint"]["base_url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
backend = create_backend(JobSettings.from_config(prepare(raw), "endpoint"), None)
print(json.dumps({"backend": type(backend).__name__, "served": backend.provenance()["served_model"],
                  "loaded": sorted(m for m in ("vllm", "torch", "transformers") if m in sys.modules)}))
backend.close()
server.shutdown()
"""


def test_an_endpoint_models_backend_is_created_and_opened_without_vllm(tiny_raw_config):
    raw = dict(tiny_raw_config, run_models=["endpoint"])
    raw["models"] = {
        "endpoint": {
            **{k: v for k, v in tiny_raw_config["models"]["tiny"].items() if k not in ("source", "path")},
            "backend": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "openai_api": "chat",
            "served_model": "served",
        }
    }
    done = subprocess.run(
        [sys.executable, "-c", _ENDPOINT_SCRIPT, json.dumps(raw)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"backend": "OpenAIBackend", "served": "served", "loaded": []}

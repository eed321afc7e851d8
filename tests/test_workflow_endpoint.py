"""The workflow end to end with an endpoint model (backend: openai) beside the in-process one.

A real vLLM OpenAI-compatible server serves the tiny Llama on 127.0.0.1; the
workflow runs the tiny config with two models: `tiny-llama` in-process and
`tiny-endpoint` through the server.  Same weights, greedy: the same generations.
"""

from __future__ import annotations

import pytest
import yaml

from endpoint_fixtures import VLLMServer
from procexec.io.jsonl import read_jsonl
from test_workflow import TINY, snakemake, write_yaml

pytestmark = [pytest.mark.workflow, pytest.mark.vllm]


def test_workflow_runs_an_endpoint_model_beside_the_in_process_one(tiny_manifest, tmp_path):
    server = VLLMServer(tiny_manifest.parent / "hf", tmp_path / "server.log").start()
    try:
        tiny = yaml.safe_load(TINY.read_text())["models"]["tiny-llama"]
        endpoint = {**tiny, "abbrev": "TINY-EP", "shards": 1, "backend": "openai", "base_url": server.base_url,
                    "served_model": "tiny", "max_model_len": 2048, "max_concurrency": 2}
        overlay = write_yaml(tmp_path / "endpoint.yaml", {"run_models": ["tiny-llama", "tiny-endpoint"],
                                                          "models": {"tiny-endpoint": endpoint}})
        workdir = tmp_path / "work"
        workdir.mkdir()
        proc = snakemake(workdir, "--cores", "2", "--scheduler", "greedy", "--show-failed-logs", "all",
                         configfiles=[TINY, overlay])
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
        out = proc.stdout + proc.stderr
        assert "localrule infer_endpoint:" in out  # endpoint jobs run on the submit host
        results = workdir / "results"
        for dataset in yaml.safe_load(TINY.read_text())["suite"]["datasets"]:
            local = [o for _, o in read_jsonl(results / "generations" / "tiny-llama" / f"{dataset}.jsonl.gz")]
            remote = [o for _, o in read_jsonl(results / "generations" / "tiny-endpoint" / f"{dataset}.jsonl.gz")]
            assert [(o["id"], o["text"], o["token_ids"]) for o in local] == [
                (o["id"], o["text"], o["token_ids"]) for o in remote]
            assert {o["provenance"]["backend"] for o in remote} == {"openai"}
            assert (results / "scores" / "tiny-endpoint" / f"{dataset}.parquet").exists()
        assert "TINY-EP" in (results / "report" / "index.html").read_text()
    finally:
        server.stop()

"""The workflow end to end with the three backends side by side.

A real vLLM OpenAI-compatible server serves the tiny Llama on 127.0.0.1; the
workflow runs the tiny config with three models: `tiny-llama` in-process,
`tiny-endpoint` through that server (backend: openai, from the submit host) and
`tiny-server` through a server its own inference job starts and stops (backend:
vllm-server, the frontier models' route).  Same weights, greedy: the same generations.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from endpoint_fixtures import VLLMServer
from procexec.io.jsonl import read_jsonl
from test_workflow import TINY, snakemake, write_yaml

pytestmark = [pytest.mark.workflow, pytest.mark.vllm]


def _cwd(pid: str) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:  # gone meanwhile
        return None


def test_workflow_runs_endpoint_and_job_server_models_beside_the_in_process_one(tiny_manifest, tmp_path):
    server = VLLMServer(tiny_manifest.parent / "hf", tmp_path / "server.log").start()
    try:
        tiny = yaml.safe_load(TINY.read_text())["models"]["tiny-llama"]
        endpoint = {**tiny, "abbrev": "TINY-EP", "shards": 1, "backend": "openai", "base_url": server.base_url,
                    "served_model": "tiny", "max_model_len": 2048, "max_concurrency": 2}
        job_server = {**{k: v for k, v in tiny.items() if k != "source"}, "abbrev": "TINY-SRV", "shards": 1,
                      "source": "path", "path": str(tiny_manifest.parent / "hf"), "backend": "vllm-server",
                      "max_concurrency": 2}
        overlay = write_yaml(tmp_path / "endpoint.yaml", {
            "run_models": ["tiny-llama", "tiny-endpoint", "tiny-server"],
            # one shard each: one engine start per backend
            "models": {"tiny-llama": {"shards": 1}, "tiny-endpoint": endpoint, "tiny-server": job_server}})
        workdir = tmp_path / "work"
        workdir.mkdir()
        # up to the aggregate of the three (figures and the report read it as for any model: tested elsewhere)
        proc = snakemake(workdir, "--cores", "2", "--scheduler", "greedy", "--show-failed-logs",
                         "results/aggregate/metrics.parquet", configfiles=[TINY, overlay])
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
        out = proc.stdout + proc.stderr
        assert "localrule infer_endpoint:" in out  # endpoint jobs run on the submit host
        # the job's own server: started by the inference job, stopped with it, its log beside the job's
        server_logs = list((workdir / "logs" / "infer" / "tiny-server").glob("*.server.log"))
        assert server_logs and "vllm" in server_logs[0].read_text().splitlines()[0]
        results = workdir / "results"
        for dataset in yaml.safe_load(TINY.read_text())["suite"]["datasets"]:
            local = [o for _, o in read_jsonl(results / "generations" / "tiny-llama" / f"{dataset}.jsonl.gz")]
            remote = [o for _, o in read_jsonl(results / "generations" / "tiny-endpoint" / f"{dataset}.jsonl.gz")]
            assert [(o["id"], o["text"], o["token_ids"]) for o in local] == [
                (o["id"], o["text"], o["token_ids"]) for o in remote]
            served = [o for _, o in read_jsonl(results / "generations" / "tiny-server" / f"{dataset}.jsonl.gz")]
            assert [(o["id"], o["text"], o["token_ids"]) for o in local] == [
                (o["id"], o["text"], o["token_ids"]) for o in served]
            assert {o["provenance"]["backend"] for o in remote} == {"openai"}
            assert {o["provenance"]["backend"] for o in served} == {"vllm-server"}
            assert (results / "scores" / "tiny-endpoint" / f"{dataset}.parquet").exists()
            assert (results / "scores" / "tiny-server" / f"{dataset}.parquet").exists()
        metrics = pd.read_parquet(results / "aggregate" / "metrics.parquet")
        assert set(metrics["model"]) == {"tiny-llama", "tiny-endpoint", "tiny-server"}
        # no server outlives its job (the job's server ran in the workflow's directory; others may be other tests')
        servers = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"],
                                 capture_output=True, text=True).stdout.split()
        assert [pid for pid in servers if _cwd(pid) == workdir] == []
    finally:
        server.stop()

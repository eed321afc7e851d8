"""A job server over several nodes: vLLM 0.32's own multi-node data parallelism, started by the job.

A model whose layout fits no one node (``procexec.cluster.layouts``: DS-685 and KK-1T on H100s) runs as one
SLURM job over N nodes (``rules/common.smk``, ``INFER_RESOURCES``).  ``procexec infer`` runs on the first node,
inside a job step of its own (``Study.head_step``), and starts:

* the **head** there: the job's ``vllm serve`` with ``--data-parallel-size-local`` (its node's ranks),
  ``--data-parallel-address`` (this node's address, as the others reach it) and ``--data-parallel-rpc-port``
  (``head_flags``).  Its API server is the only one: the job's client talks to it on 127.0.0.1 as on one node,
  and it routes every request over all ranks (vLLM's internal load balancing: without ``--headless`` or
  ``--data-parallel-start-rank`` ``vllm serve`` starts ``--data-parallel-size`` API processes,
  ``vllm/entrypoints/cli/serve.py:107-130``).
* one **follower** per other node, once the head listens (``wait_for_handshake``): the same command with
  ``--headless`` and ``--data-parallel-start-rank`` (node index x local ranks; ``follower_flags``).  ``--headless``
  starts no API server (serve.py:69-77) and runs ``run_headless`` (serve.py:181-266): its engines connect to the
  head's handshake socket at the address and port, and take their ranks from the start rank.  Each is a SLURM job
  step on its node (``srun --nodelist``; ``follower_command``), or a local process where the node is this machine
  (the CPU test: two "nodes" on localhost, ``PROCEXEC_JOB_NODES=localhost,localhost``).

Why this order: the head binds the handshake socket (ROUTER, ``tcp://ADDRESS:RPC_PORT``) before it starts its
own engines (``vllm/v1/engine/utils.py:1313-1328``, ``launch_core_engines``) and waits for the remote engines
without a time limit (``wait_for_engine_startup``, utils.py:1361-1409); a follower's engine sends its HELLO and
waits at most ``HANDSHAKE_TIMEOUT_MINS`` (5) for the head's answer, then dies ("Did not receive response from
front-end process within 5 minutes", ``vllm/v1/engine/core.py:110``, :1353-1377).  A follower started before the
head listens would race a 5-minute clock against the head's start-up; started after, it meets a head that is
ready to answer.

The job's own deadlines hold across nodes as on one: the head's start is watched as any server's
(``server_start_timeout_s``), and a follower that exits stops the start (``Followers.problem``) and, later, the
job (the head's group is stopped, SIGKILL after a grace period); the stall watchdog reads the head's ``/metrics``,
which count every rank's tokens.  On SIGTERM (SLURM's
``--signal=TERM@120`` reaches every step: the head's ``procexec infer`` and each follower's ``srun``) and on any
error, the followers are stopped with the server: SIGTERM to each process group, SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from procexec.engine.server_process import STOP_GRACE_S, free_port
from procexec.errors import ProcexecError

#: The job's nodes, head first, comma-separated: a job outside SLURM (or a test) names them; else SLURM's.
NODES_ENV = "PROCEXEC_JOB_NODES"
#: The head's address as the other nodes reach it (default: this node's address on the route to the second).
ADDRESS_ENV = "PROCEXEC_DP_ADDRESS"
#: SLURM variables of the step ``procexec infer`` runs in: a follower's ``srun`` must not inherit them (they
#: describe one node and one task; the job's id and node list stay), as the SLURM job-step plugin strips them.
STEP_VARIABLES = (
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_NNODES",
    "SLURM_NODELIST",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_GTIDS",
    "SLURM_DISTRIBUTION",
    "SLURM_GRES",
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_TRES_PER_TASK",
    "SLURM_MEM_PER_NODE",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPU_BIND",
    "SLURM_CPU_BIND_LIST",
    "SLURM_CPU_BIND_TYPE",
    "SLURM_CPU_BIND_VERBOSE",
    "SLURM_UMASK",
)


def job_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """The job's nodes, the head (this node) first: ``PROCEXEC_JOB_NODES``, else SLURM's node list of a job over
    several nodes (``scontrol show hostnames``), else this host alone."""
    env = os.environ if env is None else env
    named = env.get(NODES_ENV, "").strip()
    if named:
        return [host.strip() for host in named.split(",") if host.strip()]
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if nodelist and int(env.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1:
        try:
            listed = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60, check=True
            ).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ProcexecError(
                f"SLURM_JOB_NODELIST {nodelist}: `scontrol show hostnames` failed ({type(exc).__name__}): the job "
                "cannot name its nodes"
            ) from None
        head = env.get("SLURMD_NODENAME", listed[0] if listed else "")
        return [head, *[host for host in listed if host != head]]
    return [socket.gethostname()]


def is_this_machine(host: str) -> bool:
    """``host`` names this machine: its host name (short or full), or an address of the loopback."""
    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn(), "localhost"}
    if host in names:
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def head_address(hosts: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The address the followers reach the head at (vLLM binds its handshake socket to it, so an IP, not a name):
    ``PROCEXEC_DP_ADDRESS``; else this node's address on the route to the second node (a UDP socket connected
    there, which sends nothing); else this host name's address."""
    env = os.environ if env is None else env
    if env.get(ADDRESS_ENV):
        return env[ADDRESS_ENV]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(hosts[1]), 9))
            return str(probe.getsockname()[0])
    except (OSError, IndexError):
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True)
class MultiNodeLaunch:
    """How the job's server spans ``hosts``: ``data_parallel_size`` ranks, ``local_ranks`` per node."""

    hosts: tuple[str, ...]
    data_parallel_size: int
    local_ranks: int
    address: str
    rpc_port: int
    under_slurm: bool

    def head_flags(self) -> list[str]:
        """The head's data-parallel flags (after ``serve_args``, whose ``--data-parallel-size`` they keep)."""
        return [
            "--data-parallel-size-local",
            str(self.local_ranks),
            "--data-parallel-address",
            self.address,
            "--data-parallel-rpc-port",
            str(self.rpc_port),
        ]

    def follower_flags(self, index: int) -> list[str]:
        """Node ``index``'s (1, 2, ...): the head's, its first rank, no API server.  ``--api-server-count 0`` last
        (argparse: the last wins): a count in ``serve_args`` is the head's, and ``--headless`` refuses any above 0
        ("cannot be used with --headless", ``vllm/entrypoints/cli/serve.py:69-77``)."""
        first = str(index * self.local_ranks)
        return [*self.head_flags(), "--data-parallel-start-rank", first, "--headless", "--api-server-count", "0"]

    def follower_command(
        self, serve: Sequence[str], index: int, cpus: int | None = None, gpus: int | None = None
    ) -> list[str]:
        """Node ``index``'s command: ``serve`` (the head's own command line) with the follower flags, as a SLURM
        step on that node (one task, its GPUs and memory, ``cpus`` CPUs) or, on this machine, as it is."""
        command = [*serve, *self.follower_flags(index)]
        host = self.hosts[index]
        if not self.under_slurm:
            return command
        step = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--mem=0", "--kill-on-bad-exit=1"]
        step += [f"--cpus-per-task={cpus}"] if cpus else []
        step += [f"--gres=gpu:{gpus}"] if gpus else []
        return [*step, *command]


def plan_launch(
    key: str,
    data_parallel_size: int,
    tensor_parallel_size: int,
    visible_gpus: int | None,
    env: Mapping[str, str] | None = None,
) -> MultiNodeLaunch | None:
    """The job's launch over its nodes, or None on one node; one ``ProcexecError`` line where the layout and the
    job's nodes disagree (before any process starts).  ``visible_gpus``: this node's (None on the CPU)."""
    env = os.environ if env is None else env
    hosts = job_hosts(env)
    nodes = len(hosts)
    where = f"models.{key}.serve_args"
    if nodes == 1:
        if visible_gpus is not None and data_parallel_size * tensor_parallel_size > visible_gpus:
            raise ProcexecError(
                f"{where}: data parallel {data_parallel_size} x tensor_parallel_size {tensor_parallel_size} is more "
                f"than the {visible_gpus} GPU(s) visible to this job, and the job holds one node: a layout over "
                "several nodes runs as one job over them (the SLURM profile asks for it; `procexec plan`)"
            )
        return None
    if data_parallel_size % nodes:
        raise ProcexecError(
            f"{where}: data parallel {data_parallel_size} does not split over the job's {nodes} nodes "
            f"({', '.join(hosts)})"
        )
    local = data_parallel_size // nodes
    if visible_gpus is not None and local * tensor_parallel_size > visible_gpus:
        raise ProcexecError(
            f"{where}: {local} data-parallel ranks per node x tensor_parallel_size {tensor_parallel_size} are more "
            f"than the {visible_gpus} GPU(s) visible on this node"
        )
    under_slurm = not env.get(NODES_ENV) and bool(env.get("SLURM_JOB_ID"))
    if not under_slurm:
        elsewhere = [host for host in hosts[1:] if not is_this_machine(host)]
        if elsewhere:
            raise ProcexecError(
                f"{NODES_ENV}: {', '.join(elsewhere)} is not this machine, and outside a SLURM job there is no way "
                "to start a process there (run the job through the SLURM profile)"
            )
    address = head_address(hosts, env)
    return MultiNodeLaunch(tuple(hosts), data_parallel_size, local, address, free_port(address), under_slurm)


def step_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a follower's ``srun``: without the variables of the step it is started from."""
    return {name: value for name, value in env.items() if name not in STEP_VARIABLES}


def wait_for_handshake(
    address: str, port: int, head_alive: Callable[[], bool], timeout_s: float, poll_s: float = 0.5
) -> str | None:
    """Wait until the head's handshake socket accepts connections (None), or say why not: the head exited, or
    ``timeout_s`` passed (the server's start allowance)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not head_alive():
            return "exited before its data-parallel handshake socket listened"
        try:
            with socket.create_connection((address, port), timeout=2):
                return None
        except OSError:
            time.sleep(poll_s)
    return f"did not listen on its data-parallel handshake port {address}:{port} within {timeout_s:.0f} s"


class Followers:
    """The followers' processes: started in process groups of their own, watched, stopped whole."""

    def __init__(self, launch: MultiNodeLaunch, log_base: Path):
        self.launch = launch
        self.log_base = log_base
        self.procs: list[tuple[int, subprocess.Popen, Path]] = []
        self._problem: str | None = None
        self._stopping = False
        self._watcher: threading.Thread | None = None

    def log(self, index: int) -> Path:
        """Node ``index``'s log, beside the server's (``X.server.log`` -> ``X.server.node1.log``)."""
        base = self.log_base
        return base.with_name(f"{base.name.removesuffix('.log')}.node{index}.log")

    def start(
        self, serve: Sequence[str], env: Mapping[str, str], cpus: int | None = None, gpus: int | None = None
    ) -> None:
        environment = step_environment(env) if self.launch.under_slurm else dict(env)
        for index in range(1, len(self.launch.hosts)):
            log = self.log(index)
            with open(log, "ab") as handle:
                proc = subprocess.Popen(
                    self.launch.follower_command(serve, index, cpus, gpus),
                    stdin=subprocess.DEVNULL,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    start_new_session=True,
                )
            self.procs.append((index, proc, log))

    def watch(self, on_exit: Callable[[], None], poll_s: float = 1.0) -> None:
        """Call ``on_exit`` (from a thread of its own) once a follower exits while the job still needs it."""

        def loop() -> None:
            while not self._stopping:
                for index, proc, log in self.procs:
                    code = proc.poll()
                    if code is not None and not self._stopping:
                        self._problem = (
                            f"node {index} ({self.launch.hosts[index]})'s engines exited (exit code {code}; log {log})"
                        )
                        on_exit()
                        return
                time.sleep(poll_s)

        self._watcher = threading.Thread(target=loop, name="procexec-followers", daemon=True)
        self._watcher.start()

    @property
    def problem(self) -> str | None:
        """Why the followers failed the job (a follower exited), or None."""
        return self._problem

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every follower's process group (an ``srun`` forwards it to its step), SIGKILL after
        ``grace_s``."""
        self._stopping = True
        for _, proc, _ in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to ``proc``'s group, SIGKILL after ``grace_s``: a head whose remote engines are gone does not always
    end on SIGTERM (seen on the CPU: its API process, waiting for the remote rank to connect, kept running)."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def start_followers(
    launch: MultiNodeLaunch,
    serve: Sequence[str],
    env: Mapping[str, str],
    server_log: Path,
    head: subprocess.Popen,
    timeout_s: float,
    gpus: int | None = None,
) -> tuple[Followers, str | None]:
    """Once the head (``head``: ``serve`` with ``launch.head_flags()``) listens, each other node's follower
    (``serve`` with its follower flags); watched from then on, a follower's exit stops the head (its start fails,
    or its requests do, naming the node).  Returns the followers and, where the head never listened, why (module
    docstring: the launch order).  ``gpus``: each follower's step's (None on the CPU); its CPUs are the head
    step's."""
    followers = Followers(launch, server_log)
    problem = wait_for_handshake(launch.address, launch.rpc_port, lambda: head.poll() is None, timeout_s)
    if problem is not None:
        return followers, problem
    cpus = int(env["SLURM_CPUS_PER_TASK"]) if str(env.get("SLURM_CPUS_PER_TASK", "")).isdigit() else None
    followers.start(serve, env, cpus, gpus)
    followers.watch(lambda: _stop_group(head))
    return followers, None

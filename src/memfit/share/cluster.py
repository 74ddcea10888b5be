"""``memfit share --ray``: a jobs file on a Ray cluster, placed by measured memory,
enforced on every node, resumed exactly anywhere.

Public entry point (``memfit share JOBS.toml --ray [ADDRESS]`` and
``memfit.share_jobs(..., ray=...)`` call it)::

    run_on_ray(jobs, *, address=None, budget=None, device=None, workdir="memfit-share",
               restart=False, overhead=None, interval=0.5, out=None, num_cpus=1,
               max_retries=3) -> ClusterResult      # a ShareResult: the same table

Ray places tasks by the resources they *declare*; memfit declares what it measured.
Each job of the plan (:mod:`memfit.share.planner`: need + calibrated overhead) becomes
one Ray task asking for ``memory=`` its charge and ``num_cpus`` (on GPU nodes: its
fraction of a card and the ``gpu_memory`` resource, :mod:`memfit.share.cluster_nodes`),
so Ray packs the jobs onto nodes and never puts one where its charge does not fit. A job
that fits no node is refused before anything starts (:class:`ClusterFitError`, naming
the job and the largest node).

On its node each job runs as on one machine (:mod:`memfit.share.cluster_job`): its
process tree is sampled with the one sampler and the job is stopped when it goes above
its share (with ``restart``: ``memfit run`` restarts it from its checkpoint) while its
neighbours keep running. A job whose node dies is retried by Ray on another node
(``max_retries``) and ``memfit.session`` resumes it exactly from its last checkpoint:
the job's directory is on a path every node sees (``WORKDIR/jobs/NAME``; on one
machine, a directory; on a cluster, a shared filesystem that supports appends, since
every node appends to one log). Every job's samples land in ``WORKDIR/memory.jsonl``
with their ``job`` and ``node``, so ``memfit report WORKDIR`` draws all jobs of all
nodes; the live table shows each job's node, state, memory and share.

Ray is imported only here, only when called, and only in a child process (the driver,
:mod:`memfit.share.cluster_driver`, whose output goes to ``WORKDIR/ray/driver.log``):
nothing Ray prints reaches the terminal. Without an address (and no ``$RAY_ADDRESS``)
a local Ray instance is started on 127.0.0.1, without a dashboard.

Example:
    >>> from memfit.share.cluster import run_on_ray
    >>> result = run_on_ray("jobs.toml", address="10.0.0.5:6379",
    ...                     workdir="/shared/runs/share")           # doctest: +SKIP
    >>> print(result)                                               # doctest: +SKIP
    >>> result.nodes_of["small"], result.node_peak                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from memfit import checks, typed_json
from memfit.exitcodes import signal_name
from memfit.memory.process import forward_signals, kill_tree, start
from memfit.quiet import filters_children
from memfit.share.cluster_driver import (
    DRIVER_LOG_NAME,
    RAY_DIR,
    REQUEST_NAME,
    RESULT_NAME,
    DriverRequest,
    DriverResult,
    Failure,
)
from memfit.share.cluster_nodes import (
    RAY_EXTRA,
    ClusterError,
    ClusterFitError,
    Node,
    RayMissingError,
)
from memfit.share.cluster_tether import tethered
from memfit.share.cluster_view import ClusterView, LogFollower
from memfit.share.jobs import JobsSpec, load_jobs, parse_jobs
from memfit.share.layout import DEFAULT_WORKDIR, JobFiles
from memfit.share.planner import Plan, plan
from memfit.share.share_results import JobResult, RayJobResult, ShareResult
from memfit.share.states import JobState
from memfit.share.status import Status
from memfit.sizes import format_size, parse_size
from memfit.workdir import Workdir

__all__ = ["run_on_ray", "ClusterResult", "ClusterError", "ClusterFitError",
           "RayMissingError", "require_ray", "check_reachable", "ADDRESS_ENV"]

ADDRESS_ENV = "RAY_ADDRESS"         # Ray's own: the cluster to join when no address is given
_UNBOUNDED = 2**62                  # the plan's budget before the nodes are known
_CONNECT_TIMEOUT = 5.0
_DRIVER_GRACE = 40.0                # seconds the driver has to wind down after a signal


@dataclasses.dataclass(frozen=True)
class ClusterResult(ShareResult):
    """What :func:`run_on_ray` did: a :class:`~memfit.share.share_results.ShareResult` (the same
    summary table) plus where each job ran.

    Attributes:
        address: the cluster joined, or ``"local"``.
        nodes: the live nodes when the share began (largest memory first).
        nodes_of: per job, every node it ran on, in order (two or more: Ray retried it
            after its node died).
        node_peak: per node, the most memory its jobs held together at any sample.
    """

    address: str = "local"
    nodes: tuple[Node, ...] = ()
    nodes_of: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    node_peak: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [super().__str__(), f"  on Ray ({self.address}), by node:"]
        for n in self.nodes:
            ran = [j for j, on in self.nodes_of.items() if n.name in on]
            peak = self.node_peak.get(n.name, 0)
            ratio = f" ({peak / n.memory:.2f} of it)" if n.memory else ""
            lines.append(f"    {n.name} ({n.address}): memory {format_size(n.memory)}, "
                         f"most in use at once {format_size(peak)}{ratio}; jobs: "
                         f"{', '.join(ran) or '-'}")
        moved = {j: on for j, on in self.nodes_of.items() if len(on) > 1}
        for j, on in moved.items():
            lines.append(f"    {j} ran on {' → '.join(on)} (retried after its node died)")
        return "\n".join(lines)


def require_ray() -> None:
    """Checks that Ray can be imported, without importing it.

    Raises:
        RayMissingError: naming the extra to install.
    """
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise RayMissingError(f"memfit share --ray needs Ray, which is not installed: "
                              f"{RAY_EXTRA}")


def check_reachable(address: str, timeout: float = _CONNECT_TIMEOUT) -> None:
    """Checks that something listens at a Ray address (``host:port``) before Ray is asked
    to join it (Ray itself retries for a minute, printing warnings).

    Example:
        >>> try:
        ...     check_reachable("127.0.0.1:1")
        ... except ClusterError as e:
        ...     print(str(e)[:60])
        Cannot reach the Ray cluster at '127.0.0.1:1': Connection re

    Args:
        address: ``host:port``.
        timeout: seconds to wait for the connection.

    Raises:
        ClusterError: an address that is not ``host:port``, or nothing answers there.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"A Ray address is host:port, such as 127.0.0.1:6379. "
                           f"Received: address={address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise ClusterError(f"Cannot reach the Ray cluster at {address!r}: {why}. Start it "
                           f"(ray start --head) or check the address; leave the address "
                           f"out to start a local Ray instance.") from None


def _spec(jobs: Any) -> JobsSpec:
    if isinstance(jobs, JobsSpec):
        return jobs
    return load_jobs(jobs) if isinstance(jobs, str | os.PathLike) else parse_jobs(jobs)


def _plan(jobs: Any, device: str | None, overhead: Any, workdir: Any,
          restart: bool) -> tuple[Plan, int | None]:
    """The plan (charges only: the nodes are the budget) and the file's budget."""
    if isinstance(jobs, Plan):
        return jobs, None
    spec = _spec(jobs)
    return plan(spec, budget=_UNBOUNDED, device=device, overhead=overhead, workdir=workdir,
                restart=restart), spec.budget


def _raise(error: tuple[Failure, str], driver_log: Path) -> NoReturn:
    kind, message = error
    if kind == Failure.MISSING:
        raise RayMissingError(f"memfit share --ray needs Ray, which the driver could not "
                              f"import ({message}): {RAY_EXTRA}")
    if kind == Failure.FIT:
        raise ClusterFitError(message)
    if kind == Failure.CONNECT:
        raise ClusterError(f"Could not join or start Ray: {message} (Ray's own output: "
                           f"{driver_log})")
    raise ClusterError(f"{message} (Ray's own output: {driver_log})")


def _follow(proc: subprocess.Popen, follower: LogFollower, view: ClusterView,
            status: Status, interval: float, source: str) -> bool:
    """Shows the share while the driver runs; passes Ctrl-C/SIGTERM on to it. Returns
    whether a signal came."""
    with forward_signals(proc) as received:
        deadline: float | None = None
        while True:
            for line in view.feed(follower.read()):
                status.event(line)
            status.update(view.rows(), view.header(source))
            if proc.poll() is not None:
                break
            if received and deadline is None:
                deadline = time.monotonic() + _DRIVER_GRACE
                status.event(f"{signal_name(received[0])}: stopping the running "
                             f"jobs (SIGTERM: a memfit.session checkpoints); the rest are "
                             f"not started")
            if deadline is not None and time.monotonic() > deadline:
                kill_tree(proc)
            try:
                proc.wait(timeout=interval)
            except subprocess.TimeoutExpired:
                pass
    for line in view.feed(follower.read()):
        status.event(line)
    return bool(received)


def _results(p: Plan, records: Mapping[str, RayJobResult],
             view: ClusterView) -> tuple[JobResult, ...]:
    results = []
    for job in sorted(p.jobs, key=lambda j: j.index):
        r = records.get(job.name)
        files = JobFiles.of(p.workdir, job.name)
        never = job.name not in view.jobs or view.jobs[job.name].attempt == 0
        if r is None or (r.state == JobState.INTERRUPTED and never):
            results.append(JobResult.of(job, files, state=JobState.NOT_STARTED,
                                        reason="interrupted"))
            continue
        results.append(dataclasses.replace(r.plain(), directory=files.directory))
    return tuple(results)


def run_on_ray(jobs: str | os.PathLike | Sequence[Mapping[str, Any]] | JobsSpec | Plan, *,
               address: str | None = None, budget: str | int | None = None,
               device: str | None = None, workdir: str | os.PathLike = DEFAULT_WORKDIR,
               restart: bool = False, overhead: str | int | None = None,
               interval: float = 0.5, out: TextIO | None | bool = None,
               num_cpus: float = 1, max_retries: int = 3) -> ClusterResult:
    """Runs a jobs file on a Ray cluster: placed by measured memory, each job held to its
    share on its node, retried on another node (and resumed exactly) when its node dies.

    Example:
        >>> result = run_on_ray("examples/jobs.toml", overhead="256MiB",
        ...                     workdir="runs/share")                   # doctest: +SKIP
        >>> print(result)                                               # doctest: +SKIP

    Args:
        jobs: a jobs file (TOML), a list of job dicts, a :class:`JobsSpec`, or a
            :class:`~memfit.share.planner.Plan` (its charges are used as they are).
        address: the Ray cluster to join (``host:port``); default ``$RAY_ADDRESS``, else
            a local Ray instance is started (one machine, nothing to set up).
        budget: for a local Ray instance only: the memory its node declares (default:
            the file's ``budget``, else what Ray finds free). A cluster's nodes declare
            their own (``ray start --memory``).
        device: ``"cpu"`` (host memory) or ``"gpu:N"`` (charges are GPU memory); default
            as :func:`memfit.share.planner.plan` chooses.
        workdir: the share's log and the jobs' directories: a path every node sees.
        restart: supervise every job with ``memfit run`` (restarted from its checkpoint
            when over its share, instead of stopped).
        overhead: the per-process overhead charged to each job (default: calibrated).
        interval: seconds between two samples of a job.
        out: where the live table and summary go (``None``: stderr; ``False``: nowhere).
        num_cpus: CPUs each job asks Ray for.
        max_retries: how many times Ray retries a job whose node died.

    Returns:
        A :class:`ClusterResult`; ``print`` it for the summary.

    Raises:
        RayMissingError: Ray is not installed (``pip install 'memfit[ray]'``).
        ClusterError: the address is unreachable, or Ray could not be started or joined.
        ClusterFitError: a job's charge fits no node (nothing started).
        JobsFileError: a bad jobs file (nothing started).
        ValueError: a bad argument, quoting it.
    """
    interval = checks.seconds("interval", interval)
    max_retries = checks.count("max_retries", max_retries, minimum=0)
    num_cpus = checks.number("num_cpus", num_cpus, hint="Each job asks Ray for this many CPUs.")
    require_ray()
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is not None and budget is not None:
        raise ValueError(f"budget is the memory of a local Ray instance; a cluster's nodes "
                         f"declare their own (ray start --memory). Received: "
                         f"budget={budget!r}, address={address!r}")
    if address is not None and address != "auto":
        check_reachable(address)
    p, file_budget = _plan(jobs, device, overhead, workdir, restart)
    memory = budget if budget is not None else file_budget
    memory = None if memory is None else parse_size(memory, name="budget", memory=True)
    wd = Workdir(p.workdir).create()
    ray_dir = wd.path / RAY_DIR
    ray_dir.mkdir(exist_ok=True)
    for name in (RESULT_NAME, REQUEST_NAME):
        (ray_dir / name).unlink(missing_ok=True)
    since = time.time()
    typed_json.write(ray_dir / REQUEST_NAME, DriverRequest(
        plan=p, address=address, memory=memory, interval=interval, num_cpus=num_cpus,
        max_retries=max_retries, since=since, quiet=filters_children()))
    stream = sys.stderr if out is None else None if out is False else out
    status = Status(stream)  # type: ignore[arg-type]
    follower = LogFollower(wd.log, wd.log.stat().st_size if wd.log.exists() else 0)
    view = ClusterView()
    command = tethered([sys.executable, "-m", "memfit.share.cluster_driver",
                        str(ray_dir / REQUEST_NAME)])
    with open(ray_dir / DRIVER_LOG_NAME, "ab") as driver_log:
        proc = start(command, {}, stdout=driver_log, stderr=driver_log)
    try:
        interrupted = _follow(proc, follower, view, status, interval, p.source)
    except BaseException:
        kill_tree(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=_DRIVER_GRACE)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
        raise
    finally:
        status.close()
    try:
        result: DriverResult = typed_json.read(DriverResult, ray_dir / RESULT_NAME)
    except (OSError, ValueError):
        raise ClusterError(f"The Ray driver ended (exit {proc.returncode}) without a "
                           f"result; Ray's own output: {ray_dir / DRIVER_LOG_NAME}") from None
    if result.error is not None or result.plan is None:
        _raise(result.error or (Failure.CLUSTER, "The Ray driver returned no plan"),
               ray_dir / DRIVER_LOG_NAME)
    placed: Plan = result.plan
    share = ClusterResult(
        jobs=_results(placed, result.records, view), plan=placed, started=since,
        ended=time.time(), interrupted=interrupted or result.interrupted,
        max_in_use=view.max_in_use, max_charged=view.max_charged, log_path=wd.log,
        address=address or "local", nodes=result.nodes,
        nodes_of={name: tuple(v.nodes) for name, v in view.jobs.items()},
        node_peak=dict(view.node_peak))
    if stream is not None:
        print(share, file=stream)
    return share

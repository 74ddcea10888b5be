"""The Ray driver of ``memfit share --ray``: a child process that talks to Ray, and nothing else.

    python -m memfit.share.cluster_driver REQUEST

:func:`memfit.share.cluster.run_on_ray` starts this module in its own process, its output
going to ``WORKDIR/ray/driver.log``: everything Ray prints (its own log lines, its
task-retry notices, its C++ warnings) lands there, never on the user's terminal. It:

1. joins the cluster at the request's address (``$RAY_ADDRESS`` when none), or starts a
   local Ray instance (no dashboard, a 128 MiB object store, its memory the budget if
   one was given); a local instance, or a cluster on a loopback address, keeps all of
   Ray's traffic on 127.0.0.1;
2. reads the live nodes and places the plan on them
   (:func:`memfit.share.cluster_nodes.place`): a job that fits no node stops it here,
   before anything starts;
3. writes the share log's ``start`` event (the nodes, the jobs and their shares) and
   submits one task per job (:func:`memfit.share.cluster_job.run_job`) declaring its
   charge, retried by Ray up to ``max_retries`` times when its node dies;
4. waits for them; on SIGTERM or SIGINT (passed on by the parent) cancels them (each job
   gets SIGTERM and checkpoints), then forces them after a grace period;
5. writes the result (``WORKDIR/ray/result.json``: every job's record, the placed plan,
   the nodes, or the error that stopped it) and shuts Ray down.

The request (:class:`DriverRequest`) and the result (:class:`DriverResult`) are frozen
dataclasses, written as JSON data (:mod:`memfit.typed_json`, never a pickle: a workdir may
be on a disk others can write) and read back checked against their types.

Example:
    >>> request = DriverRequest(plan=plan, address=None, memory=None, interval=0.5,
    ...                         num_cpus=1, max_retries=3,
    ...                         since=time.time())               # doctest: +SKIP
    >>> typed_json.write(path, request)                         # doctest: +SKIP
    >>> subprocess.run([sys.executable, "-m", "memfit.share.cluster_driver", path])
    ... # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from memfit import typed_json
from memfit.memory.log import MemoryLog
from memfit.share.cluster_job import STOP_GRACE, run_job
from memfit.share.cluster_nodes import (
    ClusterError,
    ClusterFitError,
    Node,
    parse_nodes,
    place,
)
from memfit.share.layout import JobFiles
from memfit.share.planner import Plan
from memfit.share.share_results import JobResult, RayJobResult
from memfit.share.states import JobState
from memfit.workdir import Workdir

__all__ = ["main", "is_loopback", "DriverRequest",
           "DriverResult", "Failure", "OBJECT_STORE", "RESULT_NAME", "REQUEST_NAME",
           "DRIVER_LOG_NAME", "RAY_DIR"]

OBJECT_STORE = 128 * 2**20          # the local instance's object store: jobs pass no data
RAY_DIR = "ray"                     # WORKDIR/ray/: the driver's request, result and log
REQUEST_NAME = "request.json"
RESULT_NAME = "result.json"
DRIVER_LOG_NAME = "driver.log"
# Ray resolves a loopback address to the machine's outward IP unless told it is one
# machine (its own switch, read when Ray is imported).
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclasses.dataclass(frozen=True)
class DriverRequest:
    """What :func:`memfit.share.cluster.run_on_ray` asks of the driver
    (``WORKDIR/ray/request.json``).

    Attributes:
        plan: the plan (charges; the nodes are its budget).
        address: the cluster to join (``host:port``, ``"auto"``), or ``None``: start a
            local Ray instance.
        memory: the local instance's memory (bytes), or ``None``: what Ray finds free.
        interval: seconds between two samples of a job.
        num_cpus: CPUs each job asks Ray for.
        max_retries: how many times Ray retries a job whose node died.
        since: when the share started (Unix time; attempts are counted from then).
        card: the GPU index the plan places on (``None``: Ray's choice).
        quiet: keep TensorFlow's start-up lines out of the jobs' ``stderr.log``.
        joined: the address joined (``"local"`` for a local instance), once the driver
            has joined: the driver replaces the request with one that says it.
    """

    plan: Plan
    address: str | None
    memory: int | None
    interval: float
    num_cpus: float
    max_retries: int
    since: float
    card: int | None = None
    quiet: bool = False
    joined: str | None = None


class Failure(StrEnum):
    """What stopped the driver before or while it ran the jobs."""

    MISSING = "missing"         # Ray cannot be imported in the driver
    CONNECT = "connect"         # Ray could not be joined or started
    FIT = "fit"                 # a job fits no node (nothing started)
    CLUSTER = "cluster"         # anything else Ray said


@dataclasses.dataclass(frozen=True)
class DriverResult:
    """What the driver did (``WORKDIR/ray/result.json``): the jobs' results, or what
    stopped it.

    Attributes:
        plan: the plan as placed on the nodes (``None`` when it stopped first).
        nodes: the live nodes that run jobs.
        records: per job name, what its task returned (or, for a task that failed or
            was cancelled, what the driver made of it).
        interrupted: a signal stopped the share.
        error: ``(what, message)`` when the driver stopped without running the jobs.
    """

    plan: Plan | None = None
    nodes: tuple[Node, ...] = ()
    records: Mapping[str, RayJobResult] = dataclasses.field(default_factory=dict)
    interrupted: bool = False
    error: tuple[Failure, str] | None = None


def is_loopback(address: str | None) -> bool:
    """Whether a Ray address (``host:port``, ``None`` for a local instance) stays on this
    machine's loopback interface.

    Example:
        >>> is_loopback("127.0.0.1:6379"), is_loopback("localhost:6379"), is_loopback(None)
        (True, True, True)
        >>> is_loopback("10.0.0.5:6379")
        False

    Args:
        address: the address, or ``None``.
    """
    if address is None or address == "local":
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connect(ray: Any, address: str | None, memory: int | None) -> str:
    """``ray.init`` quietly; returns the address joined, or ``"local"``."""
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR,
             "configure_logging": True}
    if address is None:
        ray.init(address="local", include_dashboard=False, object_store_memory=OBJECT_STORE,
                 _memory=memory, **quiet)
        return "local"
    ray.init(address=address, **quiet)
    return address


def _failure(error: BaseException) -> str:
    """A Ray error in one line."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(error).__name__


def _ended_in_driver(plan: Plan, workdir: str, name: str, state: JobState,
                     reason: str) -> RayJobResult:
    """The result of a job whose task did not answer: it failed, or was cancelled."""
    job = next(j for j in plan.jobs if j.name == name)
    return RayJobResult.on_node(JobResult.of(job, JobFiles.of(workdir, name), state=state,
                                             reason=reason))


def _run(request: DriverRequest, ray: Any, received: list[int]) -> DriverResult:
    nodes = parse_nodes(ray.nodes())
    plan, options = place(request.plan, nodes, num_cpus=request.num_cpus, card=request.card)
    nodes = [n for n in nodes if n.cpus >= request.num_cpus]     # those that run jobs
    workdir = str(Path(plan.workdir).resolve())
    with MemoryLog(Workdir(workdir).log, source="share", budget=plan.budget,
                   device=plan.device, overhead=plan.overhead,
                   overhead_source=plan.overhead_source, jobs_file=plan.source,
                   interval=request.interval, ray=request.joined,
                   nodes=[n.to_json() for n in nodes],
                   jobs=[{"name": j.name, "command": list(j.command), "need": j.need,
                          "need_source": j.need_source, "share": j.charge,
                          "restart": j.restart, "ray": options[j.name]}
                         for j in plan.jobs]):
        pass
    if received:                     # Ctrl-C while Ray was starting: start nothing
        return DriverResult(plan=plan, nodes=tuple(nodes), interrupted=True)
    task = ray.remote(run_job)
    pending = {}
    for job in plan.jobs:            # largest charge first: Ray places them in this order
        ref = task.options(**options[job.name], max_retries=request.max_retries,
                           retry_exceptions=False, name=f"memfit-share:{job.name}").remote(
            job, plan.device, workdir, request.interval, request.since, request.quiet)
        pending[ref] = job.name
    records: dict[str, RayJobResult] = {}
    cancelled_at: float | None = None
    forced = False
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
        for ref in ready:
            name = pending.pop(ref)
            try:
                records[name] = ray.get(ref)
            except Exception as e:          # noqa: BLE001 - Ray's errors: the job failed
                if cancelled_at is not None:
                    records[name] = _ended_in_driver(plan, workdir, name,
                                                     JobState.INTERRUPTED, "cancelled")
                else:
                    records[name] = _ended_in_driver(plan, workdir, name, JobState.FAILED,
                                                     _failure(e))
        if received and cancelled_at is None:
            cancelled_at = time.monotonic()
            for ref in pending:
                ray.cancel(ref)             # KeyboardInterrupt in the task: SIGTERM the job
        if cancelled_at is not None and not forced \
                and time.monotonic() - cancelled_at > STOP_GRACE + 5:
            forced = True
            for ref in pending:
                ray.cancel(ref, force=True)
        if forced and time.monotonic() - cancelled_at > STOP_GRACE + 15:
            for name in pending.values():
                records[name] = _ended_in_driver(plan, workdir, name, JobState.INTERRUPTED,
                                                 "cancelled; its task did not answer")
            break
    return DriverResult(plan=plan, nodes=tuple(nodes), records=records,
                        interrupted=bool(received))


def main(argv: list[str] | None = None) -> int:
    """Runs the request in ``argv[0]`` and writes the result next to it; 0 unless the
    request could not be read (the result says what went wrong otherwise).

    Args:
        argv: ``[REQUEST]`` (default: ``sys.argv[1:]``).
    """
    args = sys.argv[1:] if argv is None else argv
    request_path = Path(args[0])
    request: DriverRequest = typed_json.read(DriverRequest, request_path)
    result_path = request_path.with_name(RESULT_NAME)
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, note)
    signal.signal(signal.SIGTERM, note)
    address = request.address
    if is_loopback(address):
        os.environ.setdefault(_LOOPBACK_ENV, "0")
    if address is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result: DriverResult
    try:
        import ray
    except ImportError as e:
        typed_json.write(result_path, DriverResult(error=(Failure.MISSING, str(e))))
        return 0
    try:
        request = dataclasses.replace(request,
                                      joined=_connect(ray, address, request.memory))
    except Exception as e:      # noqa: BLE001 - any failure to connect is told in one line
        typed_json.write(result_path, DriverResult(error=(Failure.CONNECT, _failure(e))))
        return 0
    try:
        result = _run(request, ray, received)
    except ClusterFitError as e:
        result = DriverResult(error=(Failure.FIT, str(e)))
    except ClusterError as e:
        result = DriverResult(error=(Failure.CLUSTER, str(e)))
    except Exception as e:      # noqa: BLE001 - told to the parent, with the driver log
        logging.getLogger(__name__).exception("memfit share --ray failed")
        result = DriverResult(error=(Failure.CLUSTER, f"{type(e).__name__}: {_failure(e)}"))
    typed_json.write(result_path, result)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A Ray cluster's nodes as memfit sees them, and what each job asks Ray for.

Ray places a task where the resources it *declares* are free, and checks nothing else;
memfit declares what it measured. On the CPU a job asks for ``memory=`` its charge (need
+ calibrated overhead, + ``memfit run`` when supervised: :mod:`memfit.share.planner`)
and ``num_cpus``. On a GPU, where the charge is GPU memory, a job asks for the fraction
of one card its charge is (``num_gpus=charge / card``, rounded up to Ray's 1/10,000)
and, where the nodes declare it, the same bytes of the custom resource ``gpu_memory``
(``ray start --resources '{"gpu_memory": 85899345920}'``: the node's GPU memory, all
cards together), so that cards of different sizes are charged right.

A job whose charge fits no node is refused before anything starts, naming the job and
the largest node (:class:`ClusterFitError`).

Example:
    >>> nodes = parse_nodes([{"NodeID": "ab" * 28, "Alive": True,
    ...                       "NodeManagerAddress": "10.0.0.2",
    ...                       "Resources": {"CPU": 4.0, "memory": 8 * 2**30}}])
    >>> nodes[0].name, nodes[0].memory == 8 * 2**30
    ('abababab', True)
    >>> ray_options(6 * 2**30, "cpu", nodes, num_cpus=1)
    {'num_cpus': 1, 'memory': 6442450944}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memfit.errors import MemfitError
from memfit.share.planner import Plan
from memfit.sizes import format_count, format_size

__all__ = ["Node", "ClusterError", "ClusterFitError", "RayMissingError", "parse_nodes",
           "ray_options", "place", "GPU_MEMORY_RESOURCE", "RAY_EXTRA"]

GPU_MEMORY_RESOURCE = "gpu_memory"      # a node's GPU memory in bytes, all cards together
RAY_EXTRA = "pip install 'memfit[ray]'"
_GPU_STEP = 10_000                      # Ray's resolution of a fractional GPU


class ClusterError(MemfitError):
    """The Ray cluster cannot be used as asked (unreachable, not started); nothing ran."""


class RayMissingError(ClusterError):
    """Ray is not installed: ``memfit share --ray`` needs the ``ray`` extra."""


class ClusterFitError(ClusterError, ValueError):
    """A job's charge fits no node of the cluster; nothing was started."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One live Ray node that can run jobs.

    Attributes:
        node_id: Ray's node id (hex).
        name: its first 8 characters, as tables and the log show it.
        address: the node's IP address.
        memory: bytes of Ray's ``memory`` resource: what its tasks may declare.
        cpus: Ray's ``CPU`` resource.
        gpus: Ray's ``GPU`` resource (cards).
        gpu_memory: the node's ``gpu_memory`` resource (bytes), or ``None``.
    """

    node_id: str
    name: str
    address: str
    memory: int
    cpus: float
    gpus: float
    gpu_memory: int | None

    def to_json(self) -> dict[str, Any]:
        """The node as a JSON object (the ``start`` event of the share's log lists them)."""
        return dataclasses.asdict(self)


def parse_nodes(records: Iterable[Mapping[str, Any]]) -> list[Node]:
    """The live nodes in ``ray.nodes()``'s records, largest memory first.

    Args:
        records: what ``ray.nodes()`` returns.
    """
    nodes = []
    for r in records:
        if not r.get("Alive", False):
            continue
        res = r.get("Resources") or {}
        gpu_memory = res.get(GPU_MEMORY_RESOURCE)
        nodes.append(Node(node_id=str(r["NodeID"]), name=str(r["NodeID"])[:8],
                          address=str(r.get("NodeManagerAddress", "?")),
                          memory=int(res.get("memory", 0)), cpus=float(res.get("CPU", 0)),
                          gpus=float(res.get("GPU", 0)),
                          gpu_memory=None if gpu_memory is None else int(gpu_memory)))
    return sorted(nodes, key=lambda n: (-n.memory, n.node_id))


def _card(nodes: Sequence[Node], card: int | None) -> int | None:
    """Bytes of one GPU: ``card`` if given, else the smallest declared per-card size."""
    if card is not None:
        return card
    sizes = [n.gpu_memory // int(n.gpus) for n in nodes if n.gpu_memory and n.gpus >= 1]
    return min(sizes) if sizes else None


def ray_options(charge: int, device: str, nodes: Sequence[Node], *, num_cpus: float = 1,
                card: int | None = None) -> dict[str, Any]:
    """The resources one job declares to Ray (``.options(**...)``).

    Example:
        >>> gpu = Node("cd" * 28, "cdcdcdcd", "10.0.0.3", 64 * 2**30, 8.0, 2.0, 160 * 2**30)
        >>> ray_options(20 * 2**30, "gpu:0", [gpu])
        {'num_cpus': 1, 'num_gpus': 0.25, 'resources': {'gpu_memory': 21474836480}}

    Args:
        charge: the job's charge in bytes (host memory on the CPU, GPU memory on a GPU).
        device: the plan's device, ``"cpu"`` or ``"gpu:N"``.
        nodes: the cluster's nodes (for the card size and the ``gpu_memory`` resource).
        num_cpus: CPUs the job asks for.
        card: bytes of one GPU (default: from the nodes' ``gpu_memory`` resource).

    Raises:
        ClusterError: on a GPU, when the size of a card is known from nowhere.
    """
    if device == "cpu":
        return {"num_cpus": num_cpus, "memory": int(charge)}
    size = _card(nodes, card)
    if size is None:
        raise ClusterError(f"Cannot size a GPU share for Ray: no node declares the "
                           f"{GPU_MEMORY_RESOURCE!r} resource and the size of a card is not "
                           f"known. Start the GPU nodes with ray start --resources "
                           f"'{{\"{GPU_MEMORY_RESOURCE}\": BYTES}}'.")
    fraction = min(1.0, math.ceil(charge / size * _GPU_STEP) / _GPU_STEP)
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": fraction}
    if any(n.gpu_memory for n in nodes):
        options["resources"] = {GPU_MEMORY_RESOURCE: int(charge)}
    return options


def _fits(node: Node, options: Mapping[str, Any]) -> bool:
    if node.cpus < options.get("num_cpus", 0) or node.memory < options.get("memory", 0):
        return False
    if node.gpus < options.get("num_gpus", 0):
        return False
    want = options.get("resources", {}).get(GPU_MEMORY_RESOURCE, 0)
    return not want or (node.gpu_memory or 0) >= want


def place(plan: Plan, nodes: Sequence[Node], *, num_cpus: float = 1,
          card: int | None = None) -> tuple[Plan, dict[str, dict[str, Any]]]:
    """The plan on the cluster, and every job's Ray options, once each job is known to
    fit some node.

    The plan's budget becomes the memory of the nodes that can run a job, all together;
    a job whose need is unknown (it runs alone to learn it) is charged the largest
    node's memory (on a GPU: one card).

    Example:
        >>> from memfit.share.planner import plan
        >>> p = plan([{"name": "a", "command": ["python", "-c", "pass"], "need": "1GiB"}],
        ...          budget=2**50, device="cpu", overhead="256MiB")
        >>> node = Node("ab" * 28, "abababab", "127.0.0.1", 4 * 2**30, 2.0, 0.0, None)
        >>> on_ray, options = place(p, [node])
        >>> on_ray.budget == 4 * 2**30, options["a"]["memory"] == 1280 * 2**20
        (True, True)

    Args:
        plan: the jobs, with their charges (planned on any budget at least as large as
            the largest charge).
        nodes: the cluster's live nodes.
        num_cpus: CPUs each job asks for.
        card: bytes of one GPU (see :func:`ray_options`).

    Returns:
        ``(plan, {job name: options})``: the options for ``ray.remote(...).options``.

    Raises:
        ClusterFitError: naming every job that fits no node, and the largest node.
        ClusterError: the cluster has no node that can run a task at all.
    """
    usable = [n for n in nodes if n.cpus >= num_cpus]
    if not usable:
        raise ClusterError(f"No node of the Ray cluster has {num_cpus:g} CPU(s) for a job "
                           f"(nodes: {', '.join(f'{n.name} {n.cpus:g} CPU' for n in nodes)})."
                           f" Add a worker node (ray start --address ...).")
    largest = max(usable, key=lambda n: (n.memory if plan.device == "cpu"
                                         else n.gpu_memory or n.gpus, n.node_id))
    on_cpu = plan.device == "cpu"
    alone = largest.memory if on_cpu else _card(usable, card) or 0
    jobs = tuple(dataclasses.replace(j, charge=alone) if j.exclusive else j
                 for j in plan.jobs)
    total = sum(n.memory for n in usable) if on_cpu else \
        sum(n.gpu_memory or int(n.gpus) * alone for n in usable)
    plan = dataclasses.replace(plan, jobs=jobs, budget=total, budget_source=(
        f"Ray: {format_count(len(usable), 'node')}, "
        f"largest {format_size(largest.memory if on_cpu else alone)}"))
    options, refused = {}, []
    for job in sorted(plan.jobs, key=lambda j: j.index):
        o = ray_options(job.charge, plan.device, usable, num_cpus=num_cpus, card=card)
        one_card = on_cpu or job.charge <= alone        # a job runs on one card
        if one_card and any(_fits(n, o) for n in usable):
            options[job.name] = o
        else:
            refused.append(f"{job.name!r} (charge {format_size(job.charge)})")
    if refused:
        what = (f"{format_size(largest.memory)} of memory" if plan.device == "cpu" else
                f"{largest.gpus:g} GPU(s)" + (f", {format_size(largest.gpu_memory)} GPU "
                                              f"memory" if largest.gpu_memory else ""))
        raise ClusterFitError(f"{'Job' if len(refused) == 1 else 'Jobs'} "
                              f"{', '.join(refused)} fit{'s' if len(refused) == 1 else ''} "
                              f"no node of the Ray cluster: the largest, {largest.name} "
                              f"({largest.address}), has {what} for tasks. Lower the need, "
                              f"or add a larger node. Nothing was started.")
    return plan, options

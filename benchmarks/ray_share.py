"""Plain Ray tasks vs ``memfit share --ray`` on one local Ray cluster, with the same jobs.

A local cluster on 127.0.0.1: a head that runs no job (0 CPUs) and two workers, each
declaring 4 CPUs and 800 MiB of memory. The jobs: eight tiny Keras trainings (as many
as the workers have CPUs; tests/share/ray_scripts/train.py, 3 epochs, ``memfit.session``),
each about 260 MiB of anonymous RSS. Run side by side:

- **plain Ray**: one task per job declaring only ``num_cpus=1`` (what users write
  today), which runs the training as a subprocess; the benchmark samples each job's
  process tree from inside its task with the one sampler (measurement only, nothing is
  enforced) into a log of the same format;
- **memfit**: :func:`memfit.share.cluster.run_on_ray` on the same cluster, each job
  charged need (96 MiB) + overhead (256 MiB) = 352 MiB.

For each: the most memory the jobs of each worker held together at any sample, divided
by the memory the worker declares (above 1.0: a node of that size would have run out of
memory), the most jobs that ran at once on a node, jobs killed or failed, and the
makespan. Prints a markdown table for docs/scale-out.md.

    TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/ray_share.py     # ~2 min, 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A cluster on the loopback address: Ray must not swap 127.0.0.1 for the machine's IP.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

import memfit  # noqa: E402
from memfit.env import WORKDIR_ENV  # noqa: E402
from memfit.memory.log import Event, MemoryLog  # noqa: E402
from memfit.memory.process import exit_code, ticks  # noqa: E402
from memfit.memory.sampler import TreeSampler  # noqa: E402
from memfit.share.cluster import run_on_ray  # noqa: E402
from memfit.share.cluster_nodes import parse_nodes  # noqa: E402
from memfit.share.cluster_view import ClusterView, LogFollower  # noqa: E402

MIB = 2**20
NODE_MEMORY = 800 * MIB
TRAIN = Path(__file__).resolve().parents[1] / "tests" / "share" / "ray_scripts" / "train.py"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}


def plain_task(name: str, command: list[str], env: dict, log_path: str,
               interval: float) -> dict:
    """A plain Ray task: runs the job, and only samples it (nothing is enforced)."""
    import ray

    node = ray.get_runtime_context().get_node_id()[:8]
    log = MemoryLog(log_path, source="share", header=False)
    started = time.time()
    proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log.write(Event.JOB_START, pid=proc.pid, job=name, node=node, share=0, attempt=1)
    sampler = TreeSampler(proc.pid, log=log, job=name, node=node)
    for _ in ticks(proc, interval):
        sampler.take()
    code = exit_code(proc.returncode)
    log.write(Event.EXIT, pid=proc.pid, job=name, node=node, code=code,
              state="finished" if code == 0 else "failed")
    log.close()
    return {"name": name, "code": code, "started": started, "ended": time.time()}


def run_plain(address: str, jobs: list[dict], workdir: Path, interval: float) -> dict:
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        nodes = [n for n in parse_nodes(ray.nodes()) if n.cpus > 0]
        log = workdir / "memory.jsonl"
        workdir.mkdir(parents=True)
        with MemoryLog(log, source="share", device="cpu",
                       nodes=[n.to_json() for n in nodes],
                       jobs=[{"name": j["name"], "share": 0} for j in jobs]):
            pass
        task = ray.remote(plain_task).options(num_cpus=1)
        refs = [task.remote(j["name"], j["command"],
                            {**j["env"], WORKDIR_ENV: str(workdir / "jobs" / j["name"])},
                            str(log), interval) for j in jobs]
        done = ray.get(refs)
    finally:
        ray.shutdown()
    view = ClusterView()
    view.feed(LogFollower(log).read())
    return {"view": view, "nodes": nodes,
            "failed": sum(1 for d in done if d["code"] != 0),
            "makespan": max(d["ended"] for d in done) - min(d["started"] for d in done)}


def most_at_once(records: list[dict]) -> int:
    """The most jobs that ran together on one node (from job_start/exit events)."""
    running: dict[str, set] = {}
    most = 0
    for r in sorted(records, key=lambda r: r["t"]):
        if r.get("event") == Event.JOB_START:
            running.setdefault(r["node"], set()).add(r["job"])
        elif r.get("event") == Event.EXIT:
            for jobs in running.values():
                jobs.discard(r.get("job"))
        most = max([most] + [len(j) for j in running.values()])
    return most


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.2)
    args = p.parse_args()
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="ray-share-"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    memfit.pack({"x": x, "y": (x @ rng.normal(size=(8, 1))).astype("float32")},
                tmp / "data", shards=2, progress=False)
    node = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * MIB}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**node, "num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(**node, num_cpus=4, memory=NODE_MEMORY)
    cluster.wait_for_nodes()
    try:
        jobs = [{"name": f"job{i}", "need": "96MiB", "env": ENV,
                 "command": [sys.executable, str(TRAIN), str(tmp / "data"),
                             str(tmp / "out" / f"job{i}")]}
                for i in range(1, args.jobs + 1)]
        plain = run_plain(cluster.address, jobs, tmp / "plain", args.interval)
        ours = run_on_ray(jobs, address=cluster.address, overhead="256MiB", device="cpu",
                          workdir=tmp / "memfit", interval=args.interval, out=False)
    finally:
        cluster.shutdown()
    view = ClusterView()
    records = LogFollower(tmp / "memfit" / "memory.jsonl").read()
    view.feed(records)
    plain_records = LogFollower(tmp / "plain" / "memory.jsonl").read()
    rows = {"plain": (plain["view"], plain_records, plain["failed"], plain["makespan"]),
            "memfit": (view, records, sum(1 for j in ours.jobs if j.state != "finished"),
                       ours.makespan)}
    print(f"## Ray: plain tasks vs memfit share --ray ({datetime.date.today()}, "
          f"{args.jobs} Keras jobs, 2 workers × 4 CPUs × {NODE_MEMORY // MIB} MiB)\n")
    print("| | plain Ray (`num_cpus=1`) | memfit share --ray (`memory=` 352 MiB) |")
    print("|---|---:|---:|")
    for i in range(2):
        cells = []
        for v, _, _, _ in rows.values():
            name, peak = sorted(v.node_peak.items())[i] if len(v.node_peak) > i else ("-", 0)
            cells.append(f"{peak / NODE_MEMORY:.2f} ({peak / MIB:.0f} MiB)")
        print(f"| worker {i + 1}: peak memory ÷ declared memory | {' | '.join(cells)} |")
    print(f"| most jobs at once on a worker | "
          f"{' | '.join(str(most_at_once(r)) for v, r, _, _ in rows.values())} |")
    print(f"| jobs killed or failed | "
          f"{' | '.join(str(f) for _, _, f, _ in rows.values())} |")
    print(f"| makespan | {' | '.join(f'{m:.1f} s' for *_, m in rows.values())} |")
    print(f"\nlogs: {tmp}/plain/memory.jsonl, {tmp}/memfit/memory.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

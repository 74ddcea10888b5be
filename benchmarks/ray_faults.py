"""Ray fault campaign: worker nodes of a local Ray cluster killed at random instants of
their jobs' lives under ``memfit share --ray``. Every job must end bit-identical to an
uninterrupted run, be charged once, and none may be lost.

    TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/ray_faults.py --seed 5   # 15 kills
    .venv/bin/python benchmarks/ray_faults.py --kills 4 --json kills.json         # shorter

The cluster is ``ray.cluster_utils.Cluster`` on 127.0.0.1: a head that runs no job, and
two workers, each declaring 2 CPUs and 1 GiB. A job is charged its need (128 MiB) + the
overhead (320 MiB), + 32 MiB for ``memfit run`` when supervised, so two jobs fit on one
worker and three do not. The jobs are benchmarks/fault_train.py, the training that
benchmarks/faults.py kills (``memfit.session(deterministic=True)`` streaming a packed
set), in its ``divides``, ``uneven`` and ``augment`` configurations. It records the phase
it is in (a small file rewritten at every change: start-up ``import``, ``build``,
``restore``, ``step``, ``epoch-end``, ``checkpoint``, ``finish``), and that is how a kill is
aimed. One more phase is the campaign's: ``exit``, once the job has ended (its training,
and ``memfit run`` when supervised) while its Ray task is still telling the driver.

The campaign runs rounds: one :func:`memfit.share.cluster.run_on_ray` of two jobs (one of
them supervised, ``restart = true``, by turns), with Ray's default ``max_retries=3``, in a
process of its own as a user's would be. Meanwhile the campaign takes the next of the
kills drawn from the seed (a phase, how
the node dies, a delay drawn uniformly over that phase's length in the uninterrupted
run, and, for the phases that recur, a training step from which on it may land), waits
until a job's training process is in that phase, waits the delay, and kills the worker
node that process runs on, in one of two ways:

- ``raylet``: Ray's processes die (``Cluster.remove_node(allow_graceful=False)``: the
  raylet is SIGKILLed, its workers go with it) while the machine lives on. The job's
  tether turns its worker's death into a SIGTERM: the training checkpoints and exits.
- ``machine``: every process of the node (raylet, Ray workers, the jobs' tethers,
  ``memfit run``, the trainings) is stopped at one instant (SIGSTOP), then SIGKILLed, as
  when the machine loses power: the training dies wherever it was, mid-step or mid-write.

A new worker replaces the dead one, and the killer takes the next kill. At most three kills
land per round (a job is on a killed node at most once per kill, and Ray retries it three
times); kills that a round's end leaves undone pass to the next round.

After every kill the newest checkpoint of each job that was on the node must pass its
checksums and load. After every round: each job finished, its weights and history equal
the uninterrupted run's bit for bit, and the share log accounts for it once — its
attempts are numbered 1, 2, 3... with no gap and no repeat; every attempt but the last ran
on a node that was killed, and the next one started after that kill (never two attempts
charged at once); only the last attempt has an ``exit`` event; a job whose node died after
it had ended is not started again; the result lists the attempts' nodes in order; a
node's death is not counted as a restart; no node was ever charged more than its memory,
and the share's most charged at once is never above the round's total. At the end no
process of a dead node may still run. Prints markdown tables; ``--json`` writes every
kill's record.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# A cluster on the loopback address: Ray must not swap 127.0.0.1 for the machine's IP.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import psutil  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import faults  # noqa: E402

from memfit.env import WORKDIR_ENV  # noqa: E402
from memfit.memory.log import Event, read_log  # noqa: E402

MIB = 2**20
NODE_MEMORY = 1024 * MIB
NEED, OVERHEAD = "128MiB", "320MiB"   # a TF process holds 224-260 MiB before it trains
CONFIGS = ("divides", "uneven", "augment")
# import, build, restore, step, epoch-end, checkpoint (fault_train.py's), and exit: the
# job has ended (its training, and memfit run when supervised) and its Ray task is
# reporting that end
PHASES = (*faults.PHASES, "exit")
EXIT_LENGTH = 0.25                  # the task sees its job's end within a sample (0.2 s)
RECUR = ("step", "epoch-end", "checkpoint")
MODES = ("raylet", "machine")
MAX_RETRIES = 3                     # Ray's default, as memfit share --ray passes it
JOB_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1",
           "PYTHONWARNINGS": "ignore"}
LAUNCH = "launch"                   # a victim with no training process yet (task start)
GONE = "gone"                       # the aimed job had left the node before its death
WIND_UP = "wind-up"                 # its training had ended, its memfit run not yet
LABELS = {LAUNCH: "launch (its task started, its training not yet)",
          "import": "start-up (import)", "restore": "restore (checkpoint loaded)",
          "checkpoint": "checkpoint (inside the write)",
          "finish": "finish (after fit: final weights written)",
          WIND_UP: "wind-up (training ended, its memfit run not yet)",
          "exit": "exit (the job ended, its task reporting)",
          GONE: "its task had returned (the node died after the job)"}


@dataclasses.dataclass(frozen=True)
class Draw:
    """One kill as drawn from the seed, before it is aimed at anything.

    Attributes:
        phase: the phase a job's training must be in.
        mode: ``"raylet"`` or ``"machine"``.
        delay: the part (0..1) of that phase's length to wait once it is entered.
        after: for the phases that recur, the part (0..1) of the run's steps to wait for.
    """

    phase: str
    mode: str
    delay: float
    after: float


def draws(seed: int, count: int, phases: tuple[str, ...] = PHASES,
          modes: tuple[str, ...] = MODES) -> list[Draw]:
    """The campaign's kills, drawn from ``seed`` (the same seed, the same kills)."""
    rnd = random.Random(seed)
    return [Draw(rnd.choice(phases), rnd.choice(modes), rnd.random(), rnd.random())
            for _ in range(count)]


@dataclasses.dataclass(frozen=True)
class Job:
    """One job of a round: its name, configuration, output and memfit share directories."""

    name: str
    config: str
    out: Path
    directory: Path
    supervised: bool


def node_args() -> dict:
    return {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * MIB,
            "num_cpus": 2, "memory": NODE_MEMORY}


def start_cluster(workers: int, temp_dir: Path):
    """A head that runs no job and ``workers`` workers, all on 127.0.0.1, Ray's session
    files under ``temp_dir``."""
    from ray.cluster_utils import Cluster

    # Cluster also writes the head's address into Ray's default temporary directory
    # (/tmp/ray), whatever temp_dir says, and fails on a machine where it does not exist
    # yet: point that default at temp_dir too (the driver and the jobs inherit it).
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    (temp_dir / "ray").mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "node_ip_address": "127.0.0.1", "object_store_memory": 80 * MIB, "num_cpus": 0,
        "include_dashboard": False, "temp_dir": str(temp_dir)})
    for _ in range(workers):
        cluster.add_node(**node_args())
    cluster.wait_for_nodes()
    return cluster


def raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def node_of(cluster, pid: int):
    """The worker node whose raylet ``pid`` descends from, or ``None``."""
    raylets = {raylet_pid(n): n for n in cluster.worker_nodes}
    try:
        for parent in psutil.Process(pid).parents():
            if parent.pid in raylets:
                return raylets[parent.pid]
    except psutil.Error:
        pass
    return None


def node_tree(node) -> list[psutil.Process]:
    """The raylet of ``node`` and every process below it (Ray's workers and agents, the
    jobs' tethers, memfit run, the trainings)."""
    try:
        root = psutil.Process(raylet_pid(node))
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def job_root(pid: int) -> int:
    """The job's own process above training ``pid``: the tether's child (``memfit run``
    for a supervised job, else the training itself)."""
    below = pid
    try:
        for parent in psutil.Process(pid).parents():
            if "cluster_tether.py" in _cmdline(parent):
                return below
            below = parent.pid
    except psutil.Error:
        pass
    return pid


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _phase_name(name: str) -> str:
    return "restore" if name == "restored" else name


class Killer:
    """Lands up to ``limit`` of ``pending`` (popped as they land) on one round's jobs,
    from the main thread (Ray starts a node's processes from there only).

    Args:
        cluster: the Ray cluster (its dead workers are replaced).
        jobs: the round's jobs.
        pending: the draws not landed yet, in order (shared between rounds).
        lengths: per configuration, each phase's mean length and the run's steps.
        limit: kills to land at most.
        done: says when the round's share has ended.
        log: where to tell each kill.
        node: the arguments of a new worker (``Cluster.add_node``) replacing a dead one.
    """

    def __init__(self, cluster, jobs: list[Job], pending: list[Draw],
                 lengths: dict[str, dict], limit: int, done: Callable[[], bool],
                 log: Callable[[str], None] = lambda line: None, node: dict | None = None):
        self.cluster, self.jobs, self.pending = cluster, jobs, pending
        self.lengths, self.limit, self.done, self.log = lengths, limit, done, log
        self.node = node_args() if node is None else node
        self.kills: list[dict] = []
        self.dead: set[int] = set()         # training pids of killed attempts

    def run(self) -> None:
        """Kills until ``limit`` kills landed, no draw is left, or the round ended."""
        while self.pending and len(self.kills) < self.limit and not self.done():
            aimed = self._hunt(self.pending[0])
            if aimed is None:
                return                      # the round ended first: the draw waits
            record = self._kill(self.pending[0], *aimed)
            if record is not None:
                self.pending.pop(0)
                self.kills.append(record)

    def _hunt(self, draw: Draw) -> tuple[Job, int, float] | None:
        """Waits until a job's live training process is in the drawn phase (past the
        drawn step); returns the job, the process and the delay to wait."""
        while not self.done():
            for job in self.jobs:
                now = faults.read_phase(job.out)
                wanted = "finish" if draw.phase == "exit" else draw.phase
                if now is None or now[0] != wanted or now[1] in self.dead:
                    continue
                lengths = {**self.lengths[job.config], "exit": EXIT_LENGTH}
                after = int(draw.after * lengths["steps"]) if draw.phase in RECUR else 0
                if now[2] >= after and alive(now[1]):
                    return job, now[1], draw.delay * lengths.get(draw.phase, 0.05)
            time.sleep(0.002)
        return None

    def _kill(self, draw: Draw, target: Job, pid: int, delay: float) -> dict | None:
        if draw.phase == "exit":            # once the job has ended: reaped by its tether
            node, root = node_of(self.cluster, pid), job_root(pid)
            deadline = time.monotonic() + 60
            while (psutil.pid_exists(pid) or psutil.pid_exists(root)) \
                    and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(delay)
        else:
            time.sleep(delay)
            node = node_of(self.cluster, pid)
        if node is None or draw.phase == "exit" and psutil.pid_exists(root):
            return None                     # it ended meanwhile, or hangs: aim again
        name = node.node_id[:8]
        tree = node_tree(node)
        if draw.mode == "machine":
            for _ in range(3):              # a stopped process cannot fork: three passes
                for p in tree:
                    _signal(p, signal.SIGSTOP)
                tree = list({p.pid: p for p in tree + node_tree(node)}.values())
        t = time.time()
        victims = self._victims(tree)
        if draw.mode == "machine":
            for p in tree:
                _signal(p, signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)
        record = {"mode": draw.mode, "aimed": draw.phase, "job": target.name,
                  "config": target.config, "supervised": target.supervised,
                  "delay": round(delay, 4), "node": name, "t": t,
                  "phase": victims.get(target.name, (GONE, None, None))[0],
                  "iterations": victims.get(target.name, (None, None, None))[2],
                  "victims": {j: v[0] for j, v in victims.items()}}
        self.log(f"    kill {draw.mode:7s} node {name}: aimed {draw.phase} of {target.name}, "
                 f"landed in {record['phase']}; on the node: "
                 + ", ".join(f"{j} ({v[0]})" for j, v in victims.items()))
        started = time.monotonic()
        self.cluster.add_node(**self.node)
        record["replaced_in"] = round(time.monotonic() - started, 2)
        trainings = [v[1] for v in victims.values() if v[1] is not None]
        self.dead.update(trainings)
        deadline = time.monotonic() + 60
        while any(alive(p) for p in trainings) and time.monotonic() < deadline:
            time.sleep(0.05)
        record["checkpoint_problems"] = {
            j.name: problem for j in self.jobs if j.name in victims
            for problem in [faults.checkpoint_loads(j.directory)] if problem}
        record["tree"] = [(p.pid, _created(p)) for p in tree]
        return record

    def _victims(self, tree: list[psutil.Process]) -> dict[str, tuple[str, int | None, int | None]]:
        """Per job with a process on the node: its training's phase, pid and step count
        (``launch`` and ``None`` when its task had not started the training yet)."""
        pids = {p.pid for p in tree}
        lines = [_cmdline(p) for p in tree]
        found = {}
        for job in self.jobs:
            if not any(str(job.out) in c or f"memfit-share:{job.name}" in c for c in lines):
                continue
            now = faults.read_phase(job.out)
            if now is not None and now[1] in pids:
                found[job.name] = (_phase_name(now[0]), now[1], now[2])
            elif now is not None and now[0] == "finish" and now[1] not in self.dead:
                # its training has been reaped; the job has ended once its tether's child
                # (memfit run, when supervised) has been too
                running = [p for p, c in zip(tree, lines, strict=True) if str(job.out) in c
                           and "cluster_tether.py" not in c and psutil.pid_exists(p.pid)]
                found[job.name] = (WIND_UP if running else "exit", None, now[2])
            else:
                found[job.name] = (LAUNCH, None, None)
        return found


def _created(p: psutil.Process) -> float | None:
    try:
        return p.create_time()
    except psutil.Error:
        return None


def leftovers(kills: list[dict]) -> int:
    """Processes of the killed nodes still alive (each is then SIGKILLed): a node's death
    must leave nothing running."""
    count = 0
    for k in kills:
        for pid, created in k.pop("tree", []):
            try:
                p = psutil.Process(pid)
                if created is not None and p.create_time() == created \
                        and p.status() != psutil.STATUS_ZOMBIE:
                    count += 1
                    p.kill()
            except psutil.Error:
                pass
    return count


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def accounting(records: list[dict], kills: list[dict], result, jobs: list[Job],
               node_memory: int) -> list[str]:
    """What the share log and the result say against each job being charged once."""
    problems = []
    killed_at = {k["node"]: k["t"] for k in kills}
    total = result["total_charge"]
    intervals: list[tuple[float, float, str, int]] = []      # (start, end, node, share)
    for job in jobs:
        starts = [r for r in records if r["event"] == Event.JOB_START and r.get("job") == job.name]
        exits = [r for r in records if r["event"] == Event.EXIT and r.get("job") == job.name]
        numbers = [r.get("attempt") for r in starts]
        if numbers != list(range(1, len(starts) + 1)):
            problems.append(f"{job.name}: attempts numbered {numbers}")
        if [r.get("attempt") for r in exits] != numbers[-1:]:
            problems.append(f"{job.name}: exit events of attempts "
                            f"{[r.get('attempt') for r in exits]}, started {numbers}")
        nodes = [r["node"] for r in starts]
        if nodes != result["nodes_of"].get(job.name, []):
            problems.append(f"{job.name}: ran on {nodes}, the result says "
                            f"{result['nodes_of'].get(job.name)}")
        for i, r in enumerate(starts):
            end = exits[-1]["t"] if i == len(starts) - 1 and exits else \
                killed_at.get(r["node"], float("inf"))
            if i < len(starts) - 1:
                if r["node"] not in killed_at:
                    problems.append(f"{job.name}: attempt {i + 1} on {r['node']}, a node "
                                    f"not killed, was followed by another")
                elif starts[i + 1]["t"] < killed_at[r["node"]]:
                    problems.append(f"{job.name}: attempt {i + 2} started before attempt "
                                    f"{i + 1}'s node died (charged twice)")
            intervals.append((r["t"], end, r["node"], int(r.get("share", 0))))
        on_killed = [k for k in kills if job.name in k["victims"]]
        if len(starts) > 1 + len(on_killed):
            problems.append(f"{job.name}: {len(starts)} attempts for {len(on_killed)} "
                            f"deaths of its node")
        for k in kills:
            again = [r for r in starts if r["t"] > k["t"]]
            if k["victims"].get(job.name) == "exit" and again:
                problems.append(f"{job.name}: started again (attempt {again[0]['attempt']}) "
                                f"after it had ended, when its node died before Ray heard "
                                f"(charged twice)")
        restarts = result["jobs"][job.name]["restarts"]
        if restarts:
            problems.append(f"{job.name}: {restarts} restarts counted (its node's deaths "
                            f"are not restarts, and nothing went over its share)")
    for t, _, node, _ in intervals:
        charged = sum(s for a, b, n, s in intervals if n == node and a <= t < b)
        if charged > node_memory:
            problems.append(f"node {node} charged {charged} bytes > its {node_memory}")
    if result["max_charged"] > total:
        problems.append(f"most charged at once {result['max_charged']} > all jobs' {total}")
    return problems


def share_child(request: Path) -> int:
    """The round's share, as a user runs it (``--share REQUEST``: in its own process, since
    the campaign's main thread must be free to start Ray nodes): writes the result as
    JSON beside the request."""
    from memfit.share.cluster import run_on_ray

    spec = json.loads(request.read_text())
    result = run_on_ray(spec["jobs"], address=spec["address"], overhead=OVERHEAD,
                        device="cpu", workdir=spec["workdir"], interval=0.2, out=False,
                        max_retries=MAX_RETRIES)
    out = {"jobs": {j.name: {"state": j.state, "reason": j.reason, "restarts": j.restarts,
                             "exit_code": j.exit_code} for j in result.jobs},
           "nodes_of": {k: list(v) for k, v in result.nodes_of.items()},
           "max_charged": result.max_charged,
           "total_charge": sum(j.charge for j in result.plan.jobs)}
    tmp = request.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, request.with_name("result.json"))
    return 0


def round_jobs(number: int, root: Path) -> list[Job]:
    """Round ``number``'s two jobs: two configurations by turns, one supervised."""
    configs = [CONFIGS[number % len(CONFIGS)], CONFIGS[(number + 1) % len(CONFIGS)]]
    return [Job(f"r{number}-{c}", c, root / "out" / f"r{number}-{c}",
                root / "share" / "jobs" / f"r{number}-{c}", (number + i) % 2 == 1)
            for i, c in enumerate(configs)]


def run_round(cluster, jobs: list[Job], root: Path, data: Path, pending: list[Draw],
              lengths: dict, references: dict, epochs: int, limit: int,
              log: Callable[[str], None], node: dict | None = None) -> dict:
    """One share of ``jobs`` with up to ``limit`` of the ``pending`` kills landed on it;
    what came of each job and kill, and the problems found.

    Args:
        cluster: the Ray cluster.
        jobs: the round's jobs (:func:`round_jobs`).
        root: the round's directory.
        data: the packed sets (:func:`faults.make_data`).
        pending: the draws not landed yet; those that land are taken off.
        lengths: per configuration, its phases' lengths (:func:`references`).
        references: per configuration, the uninterrupted run's weights and history.
        epochs: the trainings' epochs.
        limit: kills to land at most.
        log: where to tell each kill.
        node: the workers' arguments (a dead one is replaced by one like it).
    """
    node = node_args() if node is None else node
    root.mkdir(parents=True, exist_ok=True)
    request = root / "request.json"
    request.write_text(json.dumps({
        "address": cluster.address, "workdir": str(root / "share"),
        "jobs": [{"name": j.name, "need": NEED, "env": JOB_ENV, "restart": j.supervised,
                  "command": faults.command(data, j.out, j.config, epochs)} for j in jobs]}))
    with open(root / "share.err", "wb") as err:
        share = subprocess.Popen([sys.executable, __file__, "--share", str(request)],
                                 stdout=subprocess.DEVNULL, stderr=err)
    killer = Killer(cluster, jobs, pending, lengths, limit, lambda: share.poll() is not None,
                    log, node)
    try:
        killer.run()
        share.wait(timeout=900)
    finally:
        if share.poll() is None:
            share.terminate()
            share.wait(timeout=60)
    problems = []
    try:
        result = json.loads((root / "result.json").read_text())
    except OSError:
        err = (root / "share.err").read_text(errors="replace").strip().splitlines()
        problems.append(f"the share ended (exit {share.returncode}) without a result: "
                        f"{err[-1] if err else ''}")
        result = {"jobs": {}, "nodes_of": {}, "max_charged": 0, "total_charge": 0}
    records = list(read_log(root / "share" / "memory.jsonl"))
    outcomes = {}
    for job in jobs:
        r = result["jobs"].get(job.name, {"state": "lost", "reason": ""})
        same = r["state"] == "finished" and (job.out / "history.json").exists() and \
            faults.identical(faults.finals(job.out), references[job.config])
        outcomes[job.name] = {"config": job.config, "supervised": job.supervised,
                              "state": r["state"], "reason": r["reason"],
                              "identical": bool(same),
                              "attempts": len(result["nodes_of"].get(job.name, ()))}
    if result["jobs"]:
        problems += accounting(records, killer.kills, result, jobs, node["memory"])
    for k in killer.kills:
        retried = [r["t"] for r in records if r["event"] == Event.JOB_START
                   and r.get("job") in k["victims"] and r["t"] > k["t"]]
        k["retried_after"] = round(min(retried) - k["t"], 2) if retried else None
    return {"jobs": outcomes, "kills": killer.kills, "problems": problems}


def references(data: Path, work: Path, epochs: int) -> tuple[dict, dict]:
    """Each configuration run once, uninterrupted, outside Ray: its final weights and
    history, and its phases' lengths."""
    finals, lengths = {}, {}
    for config in CONFIGS:
        out = work / "reference" / config
        started = time.time()
        subprocess.run(faults.command(data, out / "out", config, epochs), check=True,
                       env={**os.environ, **JOB_ENV, WORKDIR_ENV: str(out / "wd")},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finals[config] = faults.finals(out / "out")
        lengths[config] = faults.durations(out / "out", started)
    return finals, lengths


def campaign(seed: int, kills: int, per_round: int, epochs: int, work: Path,
             log: Callable[[str], None] = lambda line: None, phases: tuple[str, ...] = PHASES,
             modes: tuple[str, ...] = MODES) -> dict:
    data = work / "data"
    faults.make_data(data)
    finals, lengths = references(data, work, epochs)
    pending = draws(seed, kills, phases, modes)
    cluster = start_cluster(2, work / "ray")
    rounds = []
    try:
        for number in range(kills + 2):
            if not pending:
                break
            root = work / f"round-{number}"
            outcome = run_round(cluster, round_jobs(number, root), root, data, pending,
                                lengths, finals, epochs, per_round, log)
            outcome["round"] = number
            for k in outcome["kills"]:
                k["round"] = number
            rounds.append(outcome)
            states = ", ".join(f"{n} {'identical' if o['identical'] else o['state'].upper()}"
                               for n, o in outcome["jobs"].items())
            log(f"  round {number}: {len(outcome['kills'])} kills; {states}"
                + "".join(f"\n    PROBLEM {p}" for p in outcome["problems"]))
    finally:
        cluster.shutdown()
    kills_done = [k for r in rounds for k in r["kills"]]
    return {"seed": seed, "rounds": rounds, "undone": len(pending), "kills": kills_done,
            "leftovers": leftovers(kills_done)}


def table(result: dict) -> str:
    kills = result["kills"]
    jobs = [o for r in result["rounds"] for o in r["jobs"].values()]
    hit = [o for o in jobs if o["attempts"] > 1]
    identical = sum(1 for o in jobs if o["identical"])
    problems = [p for r in result["rounds"] for p in r["problems"]]
    charged = [p for p in problems if not p.startswith("killer")]
    bad_ckpt = sum(len(k["checkpoint_problems"]) for k in kills)
    modes = collections.Counter(k["mode"] for k in kills)
    deaths = sum(len(k["victims"]) for k in kills)
    lost = sum(1 for o in jobs if o["state"] != "finished")
    retried = [k["retried_after"] for k in kills if k["retried_after"] is not None]
    lines = ["| figure | goal | measured |", "|---|---|---|",
             f"| node deaths (raylet / machine) | | {len(kills)} ({modes['raylet']} / "
             f"{modes['machine']}) over {len(result['rounds'])} rounds of 2 jobs |",
             f"| jobs ending bit-identical to an uninterrupted run / jobs | 100 % | "
             f"{identical} / {len(jobs)} ({100 * identical / max(1, len(jobs)):.0f} %) |",
             f"| of them, jobs whose node died at least once | | {len(hit)} "
             f"({sum(o['attempts'] - 1 for o in hit)} retries; {deaths} job deaths) |",
             f"| jobs lost (not finished) | 0 | {lost} |",
             f"| accounting faults (an attempt charged twice, a killed attempt's exit, a "
             f"gap in the attempts, a death counted as a restart, a node over its memory) "
             f"| 0 | {len(charged)} |",
             f"| unloadable checkpoints after a kill | 0 | {bad_ckpt} |",
             f"| processes of a dead node still running at the end | 0 | "
             f"{result['leftovers']} |"]
    if retried:
        lines.append(f"| seconds from a node's death to its jobs' next start | | median "
                     f"{sorted(retried)[len(retried) // 2]:.1f}, max {max(retried):.1f} |")
    phases = collections.Counter((k["phase"], k["mode"]) for k in kills)
    others = collections.Counter(
        (v, k["mode"]) for k in kills for j, v in k["victims"].items() if j != k["job"])
    lines += ["", "| phase the aimed job was in at its node's death | raylet | machine | "
                  "other jobs on the node (raylet / machine) |", "|---|---|---|---|"]
    for name in (LAUNCH, *PHASES[:-1], "finish", WIND_UP, "exit", GONE):
        row = [phases[(name, m)] for m in MODES]
        extra = [others[(name, m)] for m in MODES]
        if any(row) or any(extra):
            label = LABELS.get(name, name)
            lines.append(f"| {label} | {row[0]} | {row[1]} | {extra[0]} / {extra[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=15, help="node deaths to land")
    p.add_argument("--per-round", type=int, default=MAX_RETRIES,
                   help=f"kills per round at most (≤ {MAX_RETRIES}, Ray's retries)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write every kill's record here")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="the phases to draw from (default: all)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="the ways a node dies to draw from (default: both)")
    p.add_argument("--share", type=Path, help=argparse.SUPPRESS)   # a round's share
    args = p.parse_args(argv)
    if args.share:
        return share_child(args.share)
    if not 1 <= args.per_round <= MAX_RETRIES:
        p.error(f"--per-round must be 1 to {MAX_RETRIES} (Ray retries a job "
                f"{MAX_RETRIES} times). Received: {args.per_round}")
    if args.kills < 1:
        p.error(f"--kills must be at least 1. Received: {args.kills}")
    phases = tuple(x for x in args.phases.split(",") if x)
    modes = tuple(x for x in args.modes.split(",") if x)
    if not phases or not set(phases) <= set(PHASES):
        p.error(f"--phases takes some of {','.join(PHASES)}. Received: {args.phases!r}")
    if not modes or not set(modes) <= set(MODES):
        p.error(f"--modes takes some of {','.join(MODES)}. Received: {args.modes!r}")
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="ray-faults-"))
    try:
        work = args.workdir or tmp
        result = campaign(args.seed, args.kills, args.per_round, args.epochs, work,
                          log=lambda line: print(line, file=sys.stderr, flush=True),
                          phases=phases, modes=modes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["seconds"] = round(time.time() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(f"\n{len(result['kills'])} node deaths in {result['seconds']:.0f} s (seed "
          f"{args.seed}; {result['undone']} drawn kills left undone)")
    failed = [o for r in result["rounds"] for o in r["jobs"].values() if not o["identical"]]
    bad = [p for r in result["rounds"] for p in r["problems"]]
    bad += [k for k in result["kills"] if k["checkpoint_problems"]]
    return 1 if failed or bad or result["undone"] or result["leftovers"] else 0


if __name__ == "__main__":
    sys.exit(main())

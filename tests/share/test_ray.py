"""memfit share on a Ray cluster (issue 17): a local cluster of a head and two worker nodes,
all on 127.0.0.1, each worker declaring its memory; tiny Keras trainings as the jobs.

The head runs no job (0 CPUs). Each worker declares 4 CPUs, so that memory, not CPUs,
bounds how many jobs Ray puts on it: a job is charged need + overhead, 352 MiB, and a
worker of 800 MiB takes two.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import memfit
from memfit.env import WORKDIR_ENV
from memfit.memory.log import Event, read_log
from memfit.share.cluster import (
    ClusterError,
    ClusterFitError,
    RayMissingError,
    run_on_ray,
)
from memfit.share.cluster_nodes import Node, place, ray_options
from memfit.share.cluster_tether import tethered
from memfit.share.planner import plan
from memfit.supervise import CheckpointStore

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import faults  # noqa: E402
import ray_faults  # noqa: E402

MIB = 2**20
LOOPBACK = "127.0.0.1"
NODE_MEMORY = 800 * MIB
STORE = 80 * MIB                # Ray's smallest object store: the jobs pass no data
TRAIN = Path(__file__).parent / "ray_scripts" / "train.py"
END_THEN_FREEZE = Path(__file__).parent / "ray_scripts" / "end_then_freeze.py"
SEED_ENV = "MEMFIT_RAY_FAULT_SEED"      # replays test_a_node_killed_at_a_random_instant...
BASE = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}


def _node_args(**more) -> dict:
    return {"node_ip_address": LOOPBACK, "object_store_memory": STORE, **more}


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")       # nothing leaves this machine
        c = Cluster(initialize_head=True,
                    head_node_args=_node_args(num_cpus=0, include_dashboard=False))
        for _ in range(2):
            c.add_node(**_node_args(num_cpus=4, memory=NODE_MEMORY))
        c.wait_for_nodes()
        yield c
        c.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    path = tmp_path_factory.mktemp("ray") / "data"
    memfit.pack({"x": x, "y": y}, path, shards=2, progress=False)
    return path


def _job(name: str, data: Path, out: Path, need: str = "96MiB", epochs: int = 3,
         **env: str) -> dict:
    return {"name": name, "command": ["python", str(TRAIN), str(data), str(out / name),
                                      "--epochs", str(epochs)],
            "need": need, "env": {**BASE, **env}}


def _records(workdir: Path) -> list[dict]:
    return list(read_log(workdir / "memory.jsonl"))


def _most_on_each_node(records: list[dict], value) -> dict[str, int]:
    """Per node, the most its jobs held together: at each record, the sum of every job's
    latest ``value`` on that node (a job's value leaves when it exits or starts over)."""
    latest: dict[str, dict[str, int]] = {}
    most: dict[str, int] = {}
    for r in sorted(records, key=lambda r: r["t"]):
        job, node = r.get("job"), r.get("node")
        if not job or not node:
            continue
        for on in latest.values():
            if r["event"] in (Event.JOB_START, Event.EXIT):
                on.pop(job, None)
        v = value(r)
        if v is not None:
            latest.setdefault(node, {})[job] = v
            most[node] = max(most.get(node, 0), sum(latest[node].values()))
    return most


def test_placed_by_measured_need_and_a_liar_is_stopped_on_its_node(cluster, data, tmp_path):
    """Five trainings on two 800 MiB workers: Ray packs them by their charge (two per
    worker, though each has 4 CPUs), a job that grows past its share is stopped on its
    node while the others finish, and no node's jobs ever held more than its memory."""
    workdir, out = tmp_path / "share", tmp_path / "out"
    jobs = [_job(n, data, out) for n in ("a", "b", "c", "d")]
    jobs.append(_job("liar", data, out, epochs=6, LEAK_MIB="24", STEP_SLEEP="0.1"))
    result = run_on_ray(jobs, address=cluster.address, overhead="256MiB", device="cpu",
                        workdir=workdir, interval=0.2, out=False)

    states = {j.name: j.state for j in result.jobs}
    assert states == {"a": "finished", "b": "finished", "c": "finished", "d": "finished",
                      "liar": "stopped"}, [(j.name, j.reason) for j in result.jobs]
    assert "above its share" in result["liar"].reason
    for name in "abcd":
        assert (out / name / "final.npz").exists()
    workers = {n.node_id[:8] for n in cluster.worker_nodes}
    assert {n.name for n in result.nodes} == workers            # the head runs no job
    records = _records(workdir)
    assert {r["node"] for r in records if r["event"] == Event.JOB_START} <= workers
    # Ray never charged a node more than its memory...
    charged = _most_on_each_node(
        [r for r in records if r["event"] in (Event.JOB_START, Event.EXIT)],
        lambda r: r["share"] if r["event"] == Event.JOB_START else None)
    assert charged and max(charged.values()) <= NODE_MEMORY
    assert max(charged.values()) > NODE_MEMORY // 2                # two jobs shared a node
    # ...and no node's jobs ever held more than its memory, at any sample.
    held = _most_on_each_node(records, lambda r: r.get("rss_anon")
                              if r["event"] == Event.SAMPLE else None)
    assert set(held) <= workers and max(held.values()) <= NODE_MEMORY, held
    assert set(result.node_peak) <= workers and max(result.node_peak.values()) <= NODE_MEMORY
    # memfit report draws every job of every node from the one log.
    from memfit.report.data import load
    measured = {p.pid for p in load(workdir).measured}
    assert {j.pid for j in result.jobs} <= measured
    record = json.loads((workdir / "jobs" / "a" / "job.json").read_text())
    assert record["state"] == "finished" and record["peak"] == result["a"].peak


def test_with_restart_a_liar_is_restarted_on_its_node_and_finishes(cluster, data, tmp_path):
    """--restart: a job that grows past its share is not stopped but restarted from its
    checkpoint (memfit run on its node), its leak starts over, and it finishes."""
    workdir, out = tmp_path / "share", tmp_path / "out"
    liar = {**_job("liar", data, out, epochs=6, LEAK_MIB="4", STEP_SLEEP="0.05"),
            "restart": True}
    # Its overhead is what a TensorFlow process holds here before it trains: 224 MiB, 260
    # with JAX installed beside it (TensorFlow then imports JAX); below that, every restart
    # would start over its share (docs/estimate.md).
    result = run_on_ray([liar], address=cluster.address, overhead="320MiB", device="cpu",
                        workdir=workdir, interval=0.2, out=False)
    job = result["liar"]
    assert job.state == "finished", (job.state, job.reason)
    assert job.restarts >= 1 and (out / "liar" / "final.npz").exists()
    assert job.host_peak <= job.share


def test_a_job_that_fits_no_node_is_refused_before_anything_starts(cluster, data,
                                                                     tmp_path):
    workdir = tmp_path / "share"
    jobs = [_job("small", data, tmp_path), _job("big", data, tmp_path, need="2GiB")]
    with pytest.raises(ClusterFitError) as e:
        run_on_ray(jobs, address=cluster.address, overhead="256MiB", device="cpu",
                   workdir=workdir, out=False)
    message = str(e.value)
    assert "\n" not in message and e.value.exit_code == 2
    assert "'big'" in message and "'small'" not in message and "800.0 MiB" in message
    assert any(n.node_id[:8] in message for n in cluster.worker_nodes)
    assert not (workdir / "jobs").exists()
    assert not (workdir / "memory.jsonl").exists()


def test_an_unreachable_address_is_one_line_and_starts_nothing(data, tmp_path):
    workdir = tmp_path / "share"
    with pytest.raises(ClusterError) as e:
        run_on_ray([_job("a", data, tmp_path)], address="127.0.0.1:1", workdir=workdir,
                   overhead="256MiB", device="cpu", out=False)
    assert "Cannot reach the Ray cluster at '127.0.0.1:1'" in str(e.value)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    assert not workdir.exists()


def test_the_cli_and_memfit_share_hand_ray_jobs_to_the_cluster(data, tmp_path):
    """`memfit share --ray ADDRESS` and `memfit.share_jobs(..., ray=ADDRESS)` go to Ray: an
    unreachable address is one line, exit 2, before any workdir exists."""
    workdir = tmp_path / "share"
    with pytest.raises(ClusterError):
        memfit.share_jobs([_job("a", data, tmp_path)], ray="127.0.0.1:1", workdir=workdir,
                     overhead="256MiB", device="cpu", out=False)
    with pytest.raises(ValueError, match="ray must be True"):
        memfit.share_jobs([_job("a", data, tmp_path)], ray=3, workdir=workdir, out=False)
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[[job]]\nname = "a"\ncommand = ["python", "-c", "pass"]\n'
                    'need = "64MiB"\n')
    out = subprocess.run([sys.executable, "-m", "memfit", "share", str(jobs), "--ray",
                          "127.0.0.1:1", "--overhead", "16MiB", "--device", "cpu",
                          "--workdir", str(workdir)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("memfit share: error: Cannot reach the Ray cluster")
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not workdir.exists()
    for ray_args, words in ((["--ray", "127.0.0.1:1", "--dry-run"], "--dry-run plans"),
                            (["--ray", ""], "--ray got an empty address")):
        out = subprocess.run([sys.executable, "-m", "memfit", "share", str(jobs), *ray_args,
                              "--workdir", str(workdir)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert not workdir.exists()


def test_without_ray_the_error_names_the_extra(data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` fails
    with pytest.raises(RayMissingError) as e:
        run_on_ray([_job("a", data, tmp_path)], workdir=tmp_path / "share", out=False)
    assert "pip install 'memfit[ray]'" in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_gpu_jobs_ask_for_their_fraction_of_a_card_and_its_memory():
    """No GPU here: the options memfit gives Ray, from the charge and the card's size."""
    gpu_node = Node("ab" * 28, "abababab", "10.0.0.2", 64 * 2**30, 8.0, 2.0, 160 * 2**30)
    assert ray_options(20 * 2**30, "gpu:0", [gpu_node], num_cpus=2) == {
        "num_cpus": 2, "num_gpus": 0.25, "resources": {"gpu_memory": 20 * 2**30}}
    assert ray_options(3 * 2**30, "gpu:0", [], card=80 * 2**30)["num_gpus"] == 0.0375
    p = plan([{"name": "a", "command": ["python", "-c", "pass"], "need": "30GiB"},
              {"name": "huge", "command": ["python", "-c", "pass"], "need": "90GiB"}],
             budget=2**50, device="gpu:0", overhead="1GiB")
    with pytest.raises(ClusterFitError, match="'huge'.*abababab"):
        place(p, [gpu_node])
    with pytest.raises(ClusterError, match="gpu_memory"):
        ray_options(2**30, "gpu:0", [Node("cd" * 28, "cdcdcdcd", "x", 2**30, 1.0, 1.0, None)])


def test_a_job_whose_node_dies_is_resumed_exactly_on_the_other(cluster, data, tmp_path):
    """The worker running the job is killed (its raylet and workers SIGKILLed, as when a
    machine dies) after the job's first checkpoints: Ray retries it on the other worker,
    memfit.session resumes it, and its weights end bit-identical to an uninterrupted run."""
    reference = subprocess.Popen(
        [sys.executable, str(TRAIN), str(data), str(tmp_path / "reference"), "--epochs",
         "4"], env={**os.environ, **BASE, WORKDIR_ENV: str(tmp_path / "reference-wd")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workdir, out = tmp_path / "share", tmp_path / "out"
    removed: list[str] = []

    def kill_its_node() -> None:
        checkpoints = CheckpointStore(workdir / "jobs" / "victim" / "checkpoints")
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            started = [r for r in _safe_records(workdir) if r["event"] == Event.JOB_START]
            if started and _latest(checkpoints) is not None:
                node = next(n for n in cluster.worker_nodes
                            if n.node_id[:8] == started[0]["node"])
                removed.append(started[0]["node"])
                cluster.remove_node(node, allow_graceful=False)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_its_node, daemon=True)
    killer.start()
    result = run_on_ray([_job("victim", data, out, epochs=4, STEP_SLEEP="0.1")],
                        address=cluster.address, overhead="256MiB", device="cpu",
                        workdir=workdir, interval=0.2, out=False, max_retries=3)
    killer.join(timeout=10)
    assert reference.wait(timeout=240) == 0, reference.stderr.read()[-2000:]

    victim = result["victim"]
    assert victim.state == "finished", victim.reason
    ran_on = result.nodes_of["victim"]
    assert removed and ran_on[0] == removed[0] and ran_on[-1] != removed[0], ran_on
    own = list(read_log(workdir / "jobs" / "victim" / "memory.jsonl"))
    # The dying worker's tether turned the node's death into a SIGTERM: a checkpoint...
    assert any(r["event"] == Event.CHECKPOINT and str(r.get("reason")).startswith("preempted")
               for r in own), [r for r in own if r["event"] == Event.CHECKPOINT]
    # ...from which the retry on the other node resumed, not from scratch.
    resumed = [r for r in own if r["event"] == Event.RESUME]
    assert resumed[-1]["epoch"] + resumed[-1]["step"] > 0
    ours = np.load(out / "victim" / "final.npz")
    theirs = np.load(tmp_path / "reference" / "final.npz")
    assert len(ours.files) == len(theirs.files)
    for name in ours.files:
        assert np.array_equal(ours[name], theirs[name]), name


def _safe_records(workdir: Path) -> list[dict]:
    try:
        return _records(workdir)
    except Exception:       # noqa: BLE001 - not written yet
        return []


def _latest(store: CheckpointStore):
    try:
        return store.latest()
    except Exception:       # noqa: BLE001 - not written yet
        return None


def test_the_tether_writes_how_its_command_ended_the_instant_it_ends(tmp_path):
    """exit.json: the command's exit status, written by the tether (a temporary name, then
    renamed); a tether that is itself killed writes nothing."""
    status = tmp_path / "exit.json"
    before = time.time()
    done = subprocess.run(tethered([sys.executable, "-c", "raise SystemExit(3)"],
                                   status=status))
    assert done.returncode == 3
    written = json.loads(status.read_text())
    assert written["code"] == 3 and before <= written["t"] <= time.time()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit.json"]
    status.unlink()
    proc = subprocess.Popen(tethered([sys.executable, "-c", "import time; time.sleep(30)"],
                                     status=status))
    time.sleep(0.5)
    proc.kill()
    assert proc.wait(timeout=30) == -9
    time.sleep(0.2)
    assert not status.exists()


def _two_workers(cluster) -> None:
    """Back to two live workers (a test before may have killed one)."""
    while len(cluster.worker_nodes) < 2:
        cluster.add_node(**_node_args(num_cpus=4, memory=NODE_MEMORY))
    cluster.wait_for_nodes()


def _raylet(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def test_a_job_that_ended_is_not_run_again_when_its_node_dies_before_ray_heard(
        cluster, tmp_path):
    """The job ends (exit 0) and its node dies before its Ray task could tell the driver:
    Ray retries the task on the other worker, and the retry reports the end from what the
    tether wrote (exit.json) instead of running the job a second time, which would charge
    it twice and, for a job that keeps no checkpoint, redo all its work."""
    _two_workers(cluster)
    runs, workdir = tmp_path / "runs.txt", tmp_path / "share"
    killed: list[str] = []

    def kill_its_node() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            lines = runs.read_text().split() if runs.exists() else []
            if lines:
                worker = psutil.Process(int(lines[1]))
                while worker.status() != psutil.STATUS_STOPPED:
                    time.sleep(0.01)
                # The job has ended once its tether has its end on disk; a node that dies
                # before that (the tether not yet scheduled on a busy machine) takes the
                # end with it, and running the job again is then all Ray can do.
                ended = workdir / "jobs" / "once" / "exit.json"
                while not ended.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                above = {p.pid for p in worker.parents()}
                node = next(n for n in cluster.worker_nodes if _raylet(n) in above)
                killed.append(node.node_id[:8])
                worker.kill()
                cluster.remove_node(node, allow_graceful=False)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_its_node, daemon=True)
    killer.start()
    result = run_on_ray([{"name": "once", "need": "16MiB", "env": BASE,
                          "command": [sys.executable, str(END_THEN_FREEZE), str(runs)]}],
                        address=cluster.address, overhead="64MiB", device="cpu",
                        workdir=workdir, interval=0.2, out=False)
    killer.join(timeout=10)
    assert killed, "the job's node was never killed"
    assert len(runs.read_text().splitlines()) == 1, runs.read_text()    # it ran once
    job = result["once"]
    assert (job.state, job.exit_code) == ("finished", 0), job.reason
    assert result.nodes_of["once"] == (killed[0],)
    ends = [r for r in _records(workdir) if r["event"] == Event.EXIT]
    assert [(r["job"], r["attempt"], r["node"], r["state"]) for r in ends] == \
        [("once", 1, killed[0], "finished")]
    assert json.loads((workdir / "jobs" / "once" / "job.json").read_text())["state"] == \
        "finished"
    _two_workers(cluster)


def test_a_node_killed_at_a_random_instant_loses_nothing(cluster, tmp_path):
    """One kill of benchmarks/ray_faults.py: a training's node dies at a random instant of
    a random phase (start-up, build, restore, step, epoch end, checkpoint write, its end),
    its Ray processes only or the whole machine. The job must end bit-identical to an
    uninterrupted run, accounted once. The seed changes every run and is in the message;
    $MEMFIT_RAY_FAULT_SEED replays one."""
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(10**6))
    _two_workers(cluster)
    data, reference = tmp_path / "data", tmp_path / "reference"
    faults.make_data(data)
    started = time.time()
    subprocess.run(faults.command(data, reference / "out", "divides", 2), check=True,
                   env={**os.environ, **ray_faults.JOB_ENV, WORKDIR_ENV: str(reference / "wd")},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lengths = {"divides": faults.durations(reference / "out", started)}
    finals = {"divides": faults.finals(reference / "out")}
    pending, told = ray_faults.draws(seed, 1), []
    for n in range(2):          # a phase shorter than the killer's poll may pass unseen:
        root = tmp_path / f"round-{n}"      # the kill then waits for the next share
        job = ray_faults.Job("victim", "divides", root / "out" / "victim",
                             root / "share" / "jobs" / "victim", supervised=seed % 2 == 1)
        outcome = ray_faults.run_round(
            cluster, [job], root, data, pending, lengths, finals, 2, 1, told.append,
            node=_node_args(num_cpus=4, memory=NODE_MEMORY))
        what = f"seed {seed} ({SEED_ENV}={seed} replays it): {pending} {told} {outcome}"
        assert outcome["jobs"]["victim"]["identical"], what
        assert not outcome["problems"], what
        assert not any(k["checkpoint_problems"] for k in outcome["kills"]), what
        if outcome["kills"]:
            break
    assert outcome["kills"] and not pending, what
    assert ray_faults.leftovers(outcome["kills"]) == 0, what
    _two_workers(cluster)

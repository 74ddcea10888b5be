"""Fault campaign: kill a memfit.session training at random instants, in every phase, and
check that it ends bit-identical to an uninterrupted run.

    .venv/bin/python benchmarks/faults.py                  # the full campaign (~15 min)
    .venv/bin/python benchmarks/faults.py --fast --json F  # the variant `make test` runs
    .venv/bin/python benchmarks/faults.py --backend jax    # the same on Keras's JAX backend

Each configuration of benchmarks/fault_train.py (checkpoint_every dividing the epoch's
steps and not, with and without validation and metrics, Dropout/BatchNormalization/
augmentation, MirroredStrategy over two logical CPUs, and the callbacks people use beside
memfit: EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, CSVLogger, TensorBoard,
LearningRateScheduler, TerminateOnNaN and a user callback with get_state/set_state) is
first run once, uninterrupted.
Then, per run, the training is started again and again in a fresh workdir until it
finishes; each of the first K processes is killed once. A kill picks a phase at random
(start-up and import, model build, restore, a training step, an epoch's end with its
validation and callbacks, a checkpoint write), waits for the process to enter it, and
kills it after a delay drawn uniformly over that phase's length in the uninterrupted
run: a random instant inside a random phase (dealt from a shuffled deck of the six: a
configuration's first six SIGKILLs aim at all six, the next six too, and so on). The
phase the process was really in at its death is read back from the file it keeps, and
counted. After every kill the newest
checkpoint must pass its checksums and load. At the end, weights and history must equal
the uninterrupted run's bit for bit (for the callbacks configuration the history's length
is the stopping epoch and its ``learning_rate`` the rate history; the callbacks' end
states and the CSVLogger file must equal too).

SIGKILL kills use their own restart loop (like `while ! python train.py; do :; done`),
not `memfit run`, whose crash-loop guard would rightly stop a run killed twice at the
same place. SIGTERM (preemption) is sent two ways: to a plain `python fault_train.py`,
and to `memfit run`, which passes it on; each must exit within its grace period after a
checkpoint, and the next start must redo no step (the optimizer's step count at exit
equals the one restored).

Prints a markdown table; `--json` also writes every kill's record.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from memfit.env import WORKDIR_ENV

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "fault_train.py"
PHASES = ("import", "build", "restore", "step", "epoch-end", "checkpoint")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}


def make_data(path: Path) -> None:
    """The two small packed sets the training reads (each with train and val splits)."""
    import memfit

    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 16)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(16, 4)), axis=1).astype("int64")
    memfit.pack({"x": x, "y": y}, path / "cls", shards=2, split="train=0.8,val=0.2",
                progress=False)
    np.savez(path / "cls.npz", x=x, y=y)        # the JAX runs' in-memory arrays
    xi = rng.normal(size=(800, 8, 8, 1)).astype("float32")
    yi = np.argmax(xi.reshape(800, -1)[:, :4], axis=1).astype("int64")
    memfit.pack({"x": xi, "y": yi}, path / "img", shards=2, split="train=0.8,val=0.2",
                progress=False)
    np.savez(path / "img.npz", x=xi, y=yi)
    yn = rng.integers(0, 4, size=800).astype("int64")        # noise: validation stalls
    memfit.pack({"x": x, "y": yn}, path / "noise", shards=2, split="train=0.8,val=0.2",
                progress=False)
    np.savez(path / "noise.npz", x=x, y=yn)


BACKEND = ["tensorflow"]     # the Keras backend of the trainings (--backend)


def command(data: Path, out: Path, config: str, epochs: int) -> list[str]:
    return [sys.executable, str(TRAIN), str(data), str(out), "--config", config,
            "--epochs", str(epochs), "--backend", BACKEND[0]]


def read_phase(out: Path) -> tuple[str, int, int] | None:
    """``(phase, pid, iterations)`` from the training's phase file."""
    try:
        with open(out / "phase", "rb") as f:
            name, pid, iterations = f.read(64).decode().split()
        return name, int(pid), int(iterations)
    except (OSError, ValueError):
        return None


def phase_log(out: Path) -> list[tuple[float, int, str, int]]:
    rows = []
    try:
        f = open(out / "phases.log")
    except FileNotFoundError:       # the training has not started its log yet (a busy machine)
        return rows
    with f:
        for line in f:
            t, pid, name, iterations = line.split()
            rows.append((float(t), int(pid), name, int(iterations)))
    return rows


def durations(out: Path, started: float) -> dict[str, float]:
    """Mean length of each phase in an uninterrupted run (import: from the start)."""
    spans: dict[str, list[float]] = collections.defaultdict(list)
    rows = phase_log(out)
    previous_t, previous = started, "import"
    for t, _, name, _ in rows:
        if name != previous or previous == "step":
            spans[previous].append(t - previous_t)
            previous_t, previous = t, name
    spans["restore"] += spans.pop("restored", [])
    means = {name: float(np.mean(v)) for name, v in spans.items() if v}
    means["steps"] = rows[-1][3]           # training steps of the whole run
    return means


def finals(out: Path) -> tuple[list[np.ndarray], dict, dict | None, str | None]:
    """Weights, history (its length is the stopping epoch; ``learning_rate`` the rate of
    every epoch, where ReduceLROnPlateau logs it) and, for the callbacks configuration,
    the callbacks' end states and the CSVLogger file."""
    with np.load(out / "final.npz") as f:
        weights = [f[k] for k in f.files]
    extra = out / "callbacks.json"
    return (weights, json.loads((out / "history.json").read_text()),
            json.loads(extra.read_text()) if extra.exists() else None,
            (out / "log.csv").read_text() if (out / "log.csv").exists() else None)


def identical(a: tuple, b: tuple) -> bool:
    return (len(a[0]) == len(b[0])
            and all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
            and a[1:] == b[1:])


def checkpoint_loads(workdir: Path) -> str | None:
    """``None`` when the newest checkpoint passes its checksums and loads, else why."""
    from memfit.supervise import CheckpointError, CheckpointStore

    store = CheckpointStore(workdir / "checkpoints")
    found = store.complete()
    if not found:
        return None
    try:
        ckpt = store.latest()
    except CheckpointError as e:
        return str(e)
    if ckpt is None or ckpt.path != found[-1][1]:
        return f"the newest checkpoint {found[-1][1].name} fails its checks"
    try:
        with h5py.File(ckpt.weights, "r") as f:
            f.visititems(lambda n, o: o[()] if isinstance(o, h5py.Dataset) else None)
        with np.load(ckpt.arrays) as arrays:
            for key in arrays.files:
                arrays[key]
    except Exception as e:  # noqa: BLE001 - reported
        return repr(e)
    return None


#: Where a hunt goes when the phase it waited for came and went between two looks (a
#: restore with no checkpoint, a fast checkpoint write): the next of these.
LATER = ("step", "epoch-end", "checkpoint", "finish")


def missed(out: Path, pid: int, target: str, after: int) -> bool:
    """Whether ``pid`` has been in phase ``target`` (at ``after`` steps or more) and left
    it, from the phase log."""
    return any(p == pid and name == target and iterations >= after
               for _, p, name, iterations in phase_log(out)) and \
        (read_phase(out) or ("", 0, 0))[:2] != (target, pid)


def hunt(proc: subprocess.Popen, out: Path, target: str, lengths: dict[str, float],
         rnd: random.Random) -> bool:
    """Waits until ``proc`` is in phase ``target`` (for the phases that recur, after a
    random number of the run's training steps), then a random part of that phase's
    length. A phase shorter than the 2 ms between two looks can pass unseen: then the
    next phase of :data:`LATER` is the target, so that every run gets its kills.
    Returns False if the process ended first."""
    length = lengths.get(target, 0.05)
    if target == "import":
        time.sleep(rnd.uniform(0.0, length))
        return proc.poll() is None
    after = 0
    if target not in ("build", "restore"):          # any of the run's steps, epoch ends...
        after = rnd.randrange(int(lengths["steps"]))
    wanted = (target,)
    looks = 0
    while proc.poll() is None:
        now = read_phase(out)
        if now is not None and now[1] == proc.pid and now[0] in wanted and now[2] >= after:
            time.sleep(rnd.uniform(0.0, length))
            return proc.poll() is None
        looks += 1
        if wanted == (target,) and looks % 25 == 0 and missed(out, proc.pid, target, after):
            wanted, after, length = LATER, 0, lengths.get("step", 0.05)
        time.sleep(0.002)
    return False


def wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def restored_iterations(out: Path, pid: int) -> int | None:
    for _, p, name, iterations in phase_log(out):
        if p == pid and name == "restored":
            return iterations
    return None


class Deck:
    """The phases SIGKILLs aim at: each of :data:`PHASES` once, in a random order, then
    again in a new one, so that a configuration's first ``len(PHASES)`` kills aim at every
    phase (a small campaign, such as ``--fast``'s, covers them all, where random draws
    would leave some out); the instant inside each phase stays random."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd, self.left = rnd, []

    def draw(self) -> str:
        if not self.left:
            self.left = list(PHASES)
            self.rnd.shuffle(self.left)
        return self.left.pop()


def kill_run(data: Path, root: Path, config: str, epochs: int, kills: int,
             lengths: dict[str, float], rnd: random.Random, reference: tuple,
             sig: int = signal.SIGKILL, deck: Deck | None = None) -> dict:
    """One run: start, kill (the first ``kills`` processes once each), start again,
    until the training finishes. SIGKILLs aim at the phases ``deck`` deals (a new deck
    when none is given). Returns what happened."""
    deck = deck or Deck(rnd)
    out, wd = root / "out", root / "wd"
    env = {**ENV, WORKDIR_ENV: str(wd)}
    records: list[dict] = []
    started: list[int] = []
    restarted = False
    for _ in range(kills + 20):
        proc = subprocess.Popen(command(data, out, config, epochs), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started.append(proc.pid)
        if len(records) < kills:
            target = deck.draw() if sig == signal.SIGKILL else \
                rnd.choice(("step", "epoch-end", "checkpoint", "restore"))
            if hunt(proc, out, target, lengths, rnd):
                before = read_phase(out)
                sent = time.monotonic()
                proc.send_signal(sig)
                code = wait(proc, 60.0)
                if code is None:
                    proc.kill()
                    code = proc.wait()
                took = time.monotonic() - sent
                at = read_phase(out)
                died_in = at[0] if at and at[1] == proc.pid else "import"
                if died_in == "restored":
                    died_in = "restore"
                record = {"config": config, "signal": signal.Signals(sig).name,
                          "pid": proc.pid,
                          "target": target, "phase": died_in,
                          "after_restart": restarted, "exit": code,
                          "seconds_to_exit": round(took, 3),
                          "iterations": at[2] if at and at[1] == proc.pid else None,
                          "phase_before": before[0] if before else None,
                          "checkpoint_problem": checkpoint_loads(wd)}
                records.append(record)
                restarted = True
                proc.stderr.close()
                continue
        failed = _failed(proc, records)
        if failed:
            return failed
        break
    else:
        return {"records": records, "finished": False, "error": "never finished"}
    # Steps redone: trained steps at each death minus those the next process restored.
    for record in records:
        later = started[started.index(record["pid"]) + 1:]
        restored = next((r for r in (restored_iterations(out, pid) for pid in later)
                         if r is not None), None)
        if record["phase"] in ("import", "build", "restore"):
            record["redone"] = 0            # nothing trained in that process yet
        elif record["iterations"] is not None and restored is not None:
            record["redone"] = record["iterations"] - restored
    result = finals(out)
    return {"records": records, "finished": True, "identical": identical(result, reference)}


def sigterm_memfit_run(data: Path, root: Path, config: str, epochs: int, terms: int,
                       lengths: dict[str, float], rnd: random.Random,
                       reference: tuple) -> dict:
    """SIGTERM to `memfit run` at a random instant of a random phase of its training
    process, ``terms`` times; then `memfit run` again until the training finishes."""
    out, wd = root / "out", root / "wd"
    records: list[dict] = []
    cmd = [sys.executable, "-m", "memfit", "run", "--workdir", str(wd), "--interval", "0.2",
           "--", *command(data, out, config, epochs)]
    for _ in range(terms + 5):
        parent = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        if len(records) < terms:
            target = rnd.choice(("step", "epoch-end", "checkpoint"))
            while parent.poll() is None:
                now = read_phase(out)
                if now is not None and now[0] == target and now[1] != parent.pid \
                        and _alive(now[1]):
                    break
                time.sleep(0.002)
            if parent.poll() is None:
                time.sleep(rnd.uniform(0.0, lengths.get(target, 0.05)))
                sent = time.monotonic()
                parent.send_signal(signal.SIGTERM)
                code = wait(parent, 60.0)
                took = time.monotonic() - sent
                at = read_phase(out)
                records.append({"config": config, "signal": "SIGTERM to memfit run",
                                "target": target, "phase": at[0] if at else None,
                                "exit": code, "seconds_to_exit": round(took, 3),
                                "iterations": at[2] if at else None,
                                "child": at[1] if at else None,
                                "checkpoint_problem": checkpoint_loads(wd)})
                parent.stderr.close()
                continue
        failed = _failed(parent, records)
        if failed:
            return failed
        break
    rows = phase_log(out)
    pids = list(dict.fromkeys(p for _, p, name, _ in rows if name == "import"))
    for record in records:
        child = record.get("child")
        if child in pids and pids.index(child) + 1 < len(pids):
            restored = restored_iterations(out, pids[pids.index(child) + 1])
            if restored is not None and record["iterations"] is not None:
                record["redone"] = record["iterations"] - restored
    return {"records": records, "finished": True, "identical": identical(finals(out),
                                                                           reference)}


def warm_kill_run(data: Path, root: Path, config: str, epochs: int, kills: int,
                  lengths: dict[str, float], rnd: random.Random, reference: tuple) -> dict:
    """SIGKILLs to training processes that `memfit run --start warm --restart-every 1`
    forks from its warm parent: ``kills`` times a random instant of a random phase of a
    process not killed before; `memfit run` restarts each (forked again), and is run
    again where its crash-loop guard stops it, until the training finishes."""
    out, wd = root / "out", root / "wd"
    records: list[dict] = []
    killed: set[int] = set()
    cmd = [sys.executable, "-m", "memfit", "run", "--workdir", str(wd), "--interval", "0.2",
           "--start", "warm", "--restart-every", "1", "--max-restarts", "100", "--",
           *command(data, out, config, epochs)]
    env = {**ENV, "KERAS_BACKEND": BACKEND[0]}     # the warm parent imports that backend
    for _ in range(kills + 10):
        parent = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        while len(records) < kills and parent.poll() is None:
            target = rnd.choice(PHASES)
            after = rnd.randrange(int(lengths["steps"])) \
                if target not in ("import", "build", "restore") else 0
            victim = None
            while parent.poll() is None:
                now = read_phase(out)
                # A forked process is through its start-up phases in milliseconds: one
                # seen past the one drawn is killed a random instant later all the same.
                early = target in ("import", "build", "restore") and now is not None \
                    and now[0] in PHASES and PHASES.index(now[0]) >= PHASES.index(target)
                if now is not None and now[1] not in killed and _alive(now[1]) \
                        and now[1] != parent.pid and (now[0] == target or early) \
                        and now[2] >= after:
                    victim = now[1]
                    break
                time.sleep(0.002)
            if victim is None:
                break
            time.sleep(rnd.uniform(0.0, lengths.get(target, 0.05)))
            at = read_phase(out)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            died_in = at[0] if at and at[1] == victim else "finish"
            records.append({"config": config, "signal": "SIGKILL", "warm": True,
                            "pid": victim, "target": target,
                            "phase": "restore" if died_in == "restored" else died_in,
                            "after_restart": True, "exit": None, "seconds_to_exit": 0.0,
                            "iterations": at[2] if at and at[1] == victim else None,
                            "checkpoint_problem": None})
            while _alive(victim):
                time.sleep(0.01)
            records[-1]["checkpoint_problem"] = checkpoint_loads(wd)
        stderr = parent.communicate()[1].decode(errors="replace")
        if parent.returncode == 0:
            break
    else:
        return {"records": records, "finished": False,
                "error": f"never finished: {stderr[-2000:]}"}
    log = [json.loads(line) for line in (wd / "memory.jsonl").open()]
    exits = [r for r in log if r.get("event") == "exit" and r.get("source") != "session"
             and "start" in r]
    warm = sum(1 for r in exits if r["start"] == "warm")
    return {"records": records, "finished": True, "warm_processes": warm,
            "processes": len(exits), "identical": identical(finals(out), reference)}


def _failed(proc: subprocess.Popen, records: list[dict]) -> dict | None:
    """Waits for the last, unkilled process; the run's outcome if it failed."""
    stderr = proc.communicate()[1].decode(errors="replace")
    if proc.returncode == 0:
        return None
    return {"records": records, "finished": False,
            "error": f"exit {proc.returncode}: {stderr[-2000:]}"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def campaign(configs: list[str], runs: int, kills: int, terms: int, epochs: int, seed: int,
             work: Path, progress: bool = True, warm_runs: int = 0) -> dict:
    data = work / "data"
    make_data(data)
    rnd = random.Random(seed)
    all_records: list[dict] = []
    outcomes: list[dict] = []
    for config in configs:
        ref_root = work / config / "reference"
        started = time.time()
        subprocess.run(command(data, ref_root / "out", config, epochs), check=True,
                       env={**ENV, WORKDIR_ENV: str(ref_root / "wd")},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reference = finals(ref_root / "out")
        lengths = durations(ref_root / "out", started)
        plans = [("SIGKILL", i) for i in range(runs)]
        plans += [("SIGTERM", 0), ("SIGTERM memfit run", 0)] if terms else []
        plans += [("SIGKILL warm", i) for i in range(warm_runs)]
        deck = Deck(rnd)            # shared by the configuration's SIGKILL runs
        for kind, i in plans:
            root = work / config / f"{kind.replace(' ', '-')}-{i}"
            if kind == "SIGKILL":
                outcome = kill_run(data, root, config, epochs, kills, lengths, rnd, reference,
                                   deck=deck)
            elif kind == "SIGKILL warm":
                outcome = warm_kill_run(data, root, config, epochs, kills, lengths, rnd,
                                        reference)
            elif kind == "SIGTERM":
                outcome = kill_run(data, root, config, epochs, terms, lengths, rnd, reference,
                                   sig=signal.SIGTERM)
            else:
                outcome = sigterm_memfit_run(data, root, config, epochs, terms, lengths, rnd,
                                             reference)
            outcome.update(config=config, kind=kind)
            outcomes.append(outcome)
            all_records += outcome["records"]
            if progress:
                state = ("identical" if outcome.get("identical") else "DIFFERENT") \
                    if outcome["finished"] else f"FAILED: {outcome['error'][-300:]}"
                print(f"  {config:9s} {kind:19s} {len(outcome['records'])} signals: {state}",
                      file=sys.stderr, flush=True)
    return {"outcomes": outcomes, "records": all_records}


def table(result: dict) -> str:
    records = result["records"]
    kills = [r for r in records if r["signal"] == "SIGKILL"]
    terms = [r for r in records if r["signal"] != "SIGKILL"]
    kill_runs = [o for o in result["outcomes"] if o["kind"] == "SIGKILL"]
    warm_runs = [o for o in result["outcomes"] if o["kind"] == "SIGKILL warm"]
    kills = [r for r in kills if not r.get("warm")]
    warm_kills = [r for r in records if r.get("warm")]
    survived = sum(len(o["records"]) for o in kill_runs if o["finished"] and o["identical"])
    bad_ckpt = sum(1 for r in records if r["checkpoint_problem"])
    term_runs = [o for o in result["outcomes"] if o["kind"].startswith("SIGTERM")]
    redone = [r.get("redone") for r in terms]
    measured = [x for x in redone if x is not None]
    redone_text = (f"max {max(measured)}" if measured else "n/a") + \
        ("" if len(measured) == len(redone) else " (some not measured)")
    late = [r for r in terms if r["seconds_to_exit"] > 30.0]
    lines = ["| figure | goal | measured |", "|---|---|---|",
             f"| training kills survived bit-identical / total SIGKILLs | 100 % | "
             f"{survived} / {len(kills)} ({100 * survived / max(1, len(kills)):.0f} %) |",
             f"| unloadable checkpoints after any kill | 0 | {bad_ckpt} |",
             f"| SIGTERM: runs ending bit-identical | 100 % | "
             f"{sum(1 for o in term_runs if o['finished'] and o['identical'])} / "
             f"{len(term_runs)} |",
             f"| SIGTERM: steps redone after resume (over {len(terms)} SIGTERMs) | 0 | "
             f"{redone_text} |",
             f"| SIGTERM: exits later than the 30 s grace | 0 | {len(late)} |"]
    if warm_runs:
        ok = [o for o in warm_runs if o["finished"] and o["identical"]]
        forked = sum(o.get("warm_processes", 0) for o in warm_runs)
        total = sum(o.get("processes", 0) for o in warm_runs)
        lines.append(f"| warm start (`memfit run --start warm --restart-every 1`): SIGKILLs "
                     f"to forked training processes, runs bit-identical | 100 % | "
                     f"{len(ok)} / {len(warm_runs)} runs, {len(warm_kills)} SIGKILLs; "
                     f"{forked} of {total} processes forked warm |")
    phases = collections.Counter((r["phase"], r.get("after_restart", False)) for r in kills)
    forked = collections.Counter(r["phase"] for r in warm_kills)
    lines += ["", "| SIGKILL landed in phase | first process | restarted process | forked warm "
              "(memfit run) |", "|---|---|---|---|"]
    for name in PHASES + ("finish",):
        first, later = phases[(name, False)], phases[(name, True)]
        if first or later or forked[name]:
            lines.append(f"| {name} | {first} | {later} | {forked[name]} |")
    per_config = collections.Counter(r["config"] for r in kills)
    per_config_warm = collections.Counter(r["config"] for r in warm_kills)
    lines += ["", "| configuration | SIGKILLs | runs bit-identical | SIGKILLs, warm | warm runs "
              "bit-identical |", "|---|---|---|---|---|"]
    for config in dict.fromkeys(o["config"] for o in result["outcomes"]):
        runs = [o for o in kill_runs if o["config"] == config]
        ok = sum(1 for o in runs if o["finished"] and o["identical"])
        warm = [o for o in warm_runs if o["config"] == config]
        ok_warm = sum(1 for o in warm if o["finished"] and o["identical"])
        lines.append(f"| {config} | {per_config[config]} | {ok} / {len(runs)} | "
                     f"{per_config_warm[config]} | {ok_warm} / {len(warm)} |")
    steps_lost = [r["redone"] for r in kills if r.get("redone") is not None]
    if steps_lost:
        lines += ["", f"SIGKILL: steps trained again after a kill (work since the last "
                      f"checkpoint): mean {np.mean(steps_lost):.1f}, max {max(steps_lost)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", help="default: divides,uneven,augment,mirrored,callbacks "
                   "(on JAX without mirrored, which is tf.distribute's)")
    p.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow",
                   help="the Keras backend of the trainings (jax: in-memory NumPy data, "
                        "no TensorFlow imported by them)")
    p.add_argument("--runs", type=int, default=5, help="SIGKILL runs per configuration")
    p.add_argument("--kills", type=int, default=5, help="SIGKILLs per run")
    p.add_argument("--terms", type=int, default=2,
                   help="SIGTERMs per preemption run (0: none)")
    p.add_argument("--warm-runs", type=int, default=1,
                   help="runs per configuration under memfit run --start warm, its forked "
                        "training processes SIGKILLed --kills times (0: none)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fast", action="store_true",
                   help="the make-test variant: the augment configuration (random "
                        "augmentation: its RNG state must resume too), two runs of 3 kills "
                        "(aimed at the six phases, one each), one SIGTERM run of each "
                        "kind, no warm run (tests/supervise/test_warm.py kills warm "
                        "processes)")
    p.add_argument("--json", type=Path, help="write every kill's record here")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    args = p.parse_args(argv)
    if args.configs is None:
        args.configs = "divides,uneven,augment,callbacks" if args.backend == "jax" else \
            "divides,uneven,augment,mirrored,callbacks"
    if args.fast:
        args.configs, args.runs, args.kills, args.terms, args.epochs, args.warm_runs = \
            "augment", 2, 3, 1, 2, 0
    BACKEND[0] = args.backend
    configs = [c for c in args.configs.split(",") if c]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="memfit-faults-") as tmp:
        work = args.workdir or Path(tmp)
        result = campaign(configs, args.runs, args.kills, args.terms, args.epochs, args.seed,
                          work, warm_runs=args.warm_runs)
    result["seconds"] = round(time.time() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(f"\n{len(result['records'])} signals in {result['seconds']:.0f} s "
          f"(seed {args.seed}; backend {args.backend}; configurations "
          f"{', '.join(configs)})")
    failed = [o for o in result["outcomes"] if not (o["finished"] and o["identical"])]
    bad = [r for r in result["records"] if r["checkpoint_problem"]]
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The seed story and its three neighbours, end to end, in every view (issue 15).

Four small training scripts (scripts/), each run in its own child process:

========== ============================================ ======================================
script     what it does                                 verdict (watch / doctor / monitor)
========== ============================================ ======================================
seed       builds a list of 6,000 (x, y) tuples every   level / allocator-retention /
           epoch, stacks it, fit(epochs=1), del +       allocator-retention
           gc.collect()
leak       a global list keeps 24 MiB more every epoch  leak / memory-growth (leak) / leak
data_in_   fit() is given 160 MiB of arrays each epoch  level / data-in-ram (+ retention) /
ram                                                     stable, warm-up or retention
streamed   memfit.pack + memfit.dataset (batch 256,     level / no finding / stable (level)
           256 MiB budget)
========== ============================================ ======================================

data_in_ram's step buffers (4 MiB) come from glibc's arenas once its moving mmap threshold
has risen past them, and the arenas keep them when freed: on some machines (kernel 6.18,
2026-12-06) RSS then climbs for several epochs, +80-220 MiB, while the bytes in use
(mallinfo2) stay at 100-113 MiB and glibc's free bytes grow by as much as RSS. That is
allocator retention, measured, and never a leak: the tests accept it and nothing else.

From outside (watch) a level of data held in RAM and memory the allocator keeps look the
same: watch says "level" for both and points to the doctor, which probes with a trim.
`memfit run` judges its last process from outside the same way. Under watch and `memfit run`
each script trains for 8 s after its first (warm-up) epoch, so that watch has more steady
time than it needs (memfit.memory.watch.MIN_STEADY, 5 s) however busy the machine; a run
takes 12-20 s on 2 cores. The seed and data_in_ram train 24 s (WATCH_SECONDS): their climb
in glibc's arenas must be over before most of what watch judges. The MemoryMonitor judges
epochs, not time, and its runs train their epochs only (STORY_SECONDS=0); the doctor stops
a run after its third epoch. 14 runs in all. The command-line runs at the end check that
TensorFlow's start-up lines do not reach the user. `benchmarks/busy_neighbour.py` runs
these tests with a CPU hog pinned to their core (docs/reliability.md).
"""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.doctor import doctor
from memfit.memory.log import read_log
from memfit.memory.watch import watch

SCRIPTS = Path(__file__).parent / "scripts"
MiB = 2**20
linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
pytestmark = linux
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "STORY_EPOCHS": "6"}
# Seen from outside, a climb in glibc's arenas (module doc) lasts 4-6 s after the first
# epoch, longer beside a busy process, and watch sees only RSS: after 8 s it can still look
# like growth (2026-12-06: data_in_ram a leak in 1 of 3 runs; the seed in 1 of 4 rounds
# beside a CPU hog, benchmarks/busy_neighbour.py --pin beside), after 24 s it is a level.
WATCH_SECONDS = {"data_in_ram": "24", "seed": "24"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    sys.path.insert(0, str(SCRIPTS))
    work = tmp_path_factory.mktemp("packed")
    import numpy as np

    import memfit

    rng = np.random.default_rng(0)
    memfit.pack({"x": rng.random((8192, 48, 64), dtype=np.float32),
                 "y": rng.random((8192, 1), dtype=np.float32)}, work / "data", progress=False)
    return work


@pytest.fixture(scope="module")
def runs(tmp_path_factory, packed):
    cache = {}

    def get(view, name):
        if (view, name) in cache:
            return cache[view, name]
        cmd = [sys.executable, str(SCRIPTS / f"{name}.py"), str(packed)]
        workdir = tmp_path_factory.mktemp(f"{view}-{name}")
        env = {**ENV, "STORY_SECONDS": WATCH_SECONDS[name]} \
            if view == "watch" and name in WATCH_SECONDS else ENV
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            if view == "watch":
                out = watch(cmd, interval=0.1, workdir=workdir, status=io.StringIO())
            elif view == "doctor":
                out = doctor(cmd, workdir=workdir)
            else:
                # The monitor judges epoch by epoch, not by time: no steady seconds.
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                      cwd=SCRIPTS, env={**os.environ, "STORY_SECONDS": "0",
                                                        "STORY_MONITOR": str(workdir)})
                assert proc.returncode == 0, proc.stderr[-3000:]
                verdicts = [r for r in read_log(workdir / "memory.jsonl")
                            if r["event"] == "verdict"]
                out = {"stderr": proc.stderr, "verdicts": verdicts}
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        cache[view, name] = out
        return out

    return get


# -- watch: from outside, the shape only -----------------------------------------------------

@pytest.mark.parametrize("name", ["seed", "data_in_ram", "streamed"])
def test_watch_sees_a_level_and_sends_to_the_doctor(runs, name):
    result = runs("watch", name)
    text = str(result)
    assert result.exit_code == 0 and result.basis == "time slices", text
    assert result.verdict.kind in ("stable", "warm-up"), text
    assert result.headline.startswith("level: ") and "not growing" in result.headline, text
    assert "memfit doctor -- " in result.fix and "malloc_trim" in result.fix
    # no rate beside a level, no epochs that are time slices, no memory_budget to lower
    assert "/min" not in text and "/epoch" not in text and "memory_budget" not in text
    assert "Nothing to fix" not in text


def test_watch_sees_the_leak_grow_per_minute(runs):
    result = runs("watch", "leak")
    text = str(result)
    assert result.verdict.kind == "leak", text
    assert result.headline.startswith("leak: ") and "/min" in result.headline
    assert "/epoch" not in text and "Retention cannot be ruled out from outside" in text


# -- doctor: inside, with a trim probe after del + gc.collect() ------------------------------

def test_doctor_tells_the_seed_story(runs):
    result = runs("doctor", "seed")
    text = str(result)
    print(text)
    assert result.exit_code == 0 and result.stopped == "epochs" and result.epochs == 3, text
    assert result.kinds == ["allocator-retention"], text
    f = result.findings[0]
    assert f.details["released"] >= 48 * MiB            # the list's ~70 MiB, given back
    assert f.details["kept"] - f.details["released"] < f.details["kept"]
    assert "stayed at" in f.measured and "gave back" in f.measured
    assert "list of 6,000 tuples" in f.measured and "x_train, y_train" in f.measured
    assert "not a Python leak" in f.why
    fix = "\n".join(f.fix)
    # in order of preference, with the script's own variable names
    assert fix.index("np.save(\"data/x.npy\", x_train)") < fix.index("memfit.malloc_trim()") \
        < fix.index('trim="epoch"') < fix.index("memfit run --restart-every 1")


def test_doctor_names_the_leak_and_its_list(runs):
    result = runs("doctor", "leak")
    text = str(result)
    assert result.kinds == ["memory-growth"], text
    f = result.findings[0]
    assert f.details["verdict"] == "leak" and "KEPT[" in f.measured, text


def test_doctor_finds_the_data_in_ram(runs):
    result = runs("doctor", "data_in_ram")
    assert result.kinds[0] == "data-in-ram", str(result)
    assert result.findings[0].details["fit_arrays"] >= 160 * MiB
    for f in result.findings[1:]:       # retention in glibc's arenas (module doc), no leak
        assert f.kind == "memory-growth" and f.details["verdict"] == "allocator-retention", \
            str(result)


def test_doctor_finds_nothing_in_a_streamed_training(runs):
    result = runs("doctor", "streamed")
    text = str(result)
    assert result.kinds == [] and "No memory problem found" in text, text
    # memfit's own windows are counted as memfit's, not as the user's arrays
    arrays = result.measurements["arrays"]
    assert arrays["memfit"]["bytes"] > 0, arrays
    assert all(not a.get("container") for a in arrays["largest"])


# -- MemoryMonitor: inside, epoch by epoch -----------------------------------------------------

@pytest.mark.parametrize("name,kind", [("seed", "allocator-retention"), ("leak", "leak"),
                                       ("data_in_ram", None), ("streamed", None)])
def test_memory_monitor_gives_each_script_its_verdict(runs, name, kind):
    out = runs("monitor", name)
    kinds = [v["verdict"] for v in out["verdicts"]]
    if kind is None:                     # a level: nothing grows, nothing kept after del
        assert kinds and set(kinds) <= {"stable", "warm-up", "allocator-retention"}, \
            out["stderr"][-2000:]
        for v in out["verdicts"]:        # retention only where glibc holds the growth freed
            if v["verdict"] == "allocator-retention":
                assert name == "data_in_ram" and v.get("kept") is None, v
                assert max(v.get("held") or 0, v.get("released") or 0) >= 0.5 * v["growth"], v
        return
    assert kinds[-1] == kind, out["stderr"][-2000:]
    assert f"memfit: {kind}: " in out["stderr"]
    if kind == "allocator-retention":
        v = out["verdicts"][-1]
        assert v["released"] >= 48 * MiB and v["kept"] > v["released"]
        assert "not a Python leak" in out["stderr"] and "memfit pack" in out["stderr"]


# -- as the user reads it: the command line, with no TensorFlow start-up lines ---------------

NOISE = ("oneDNN custom operations", "Could not find cuda drivers", "cuInit",
         "absl::InitializeLog")


def _cli(args, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["STORY_EPOCHS"] = ENV["STORY_EPOCHS"]
    env.update(extra)
    return subprocess.run([sys.executable, "-m", "memfit", *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)


def test_memfit_run_judges_the_seed_story_from_outside_quietly(tmp_path, packed):
    proc = _cli(["run", "--workdir", "wd", "--interval", "0.1", "--", sys.executable,
                 str(SCRIPTS / "seed.py"), str(packed)], tmp_path,
                STORY_SECONDS=WATCH_SECONDS["seed"])       # judged from outside, as watch
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "seed: trained" in said                              # the script's own output
    assert "memory of the last process (from outside): level: " in proc.stderr, said
    assert "memfit doctor -- " in proc.stderr and "/min" not in proc.stderr
    assert not [n for n in NOISE if n in said], said[-3000:]
    verdicts = [r for r in read_log(tmp_path / "wd" / "memory.jsonl")
                if r["event"] == "verdict"]
    assert [v["source"] for v in verdicts] == ["run"]


def test_memfit_doctor_tells_the_seed_story_quietly(tmp_path, packed):
    proc = _cli(["doctor", "--", sys.executable, str(SCRIPTS / "seed.py"), str(packed)],
                tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "Memory stays after del + gc.collect(): the allocator keeps what was freed" in said
    assert "gave back" in said and "x_train, y_train" in said
    assert not [n for n in NOISE if n in said], said[-3000:]

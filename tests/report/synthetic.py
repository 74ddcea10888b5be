"""Synthetic memfit logs for the report tests (and the example plot in docs/memory.md)."""

from __future__ import annotations

import math
import random
from pathlib import Path

from memfit.memory.classifier import classify
from memfit.memory.log import FORMAT, FORMAT_VERSION, MemoryLog

MiB = 2**20
GiB = 2**30
T0 = 1_796_030_000.0
SUPERVISOR, CHILD1, CHILD2 = 31400, 31401, 31402
MAX_RSS = int(2.5 * GiB)


def start(log: MemoryLog, pid: int, t: float = T0, **fields) -> None:
    """A ``start`` event for ``pid`` (MemoryLog writes its own only for the current pid)."""
    log.write("start", pid=pid, t=t, format=FORMAT, format_version=FORMAT_VERSION,
              memfit="0.1.0", **fields)


def simple_leak(path: Path, *, epochs: int = 6, pid: int = 4242, command: str = "train.py",
                gpu: bool = True, verdict: bool = False) -> list[float]:
    """One process leaking 40 MiB per epoch; returns the anon RSS at each epoch end."""
    values = []
    with MemoryLog(path, source="monitor", header=False) as log:
        start(log, pid, source="monitor", command=command)
        t = T0
        for epoch in range(epochs):
            for step in range(10):
                t += 1.0
                a = 500 * MiB + epoch * 40 * MiB + step * MiB
                extra = {"gpu": {"GPU:0": {"current": 300 * MiB + step * MiB,
                                           "peak": 400 * MiB}}, "nvml": 900 * MiB} if gpu else {}
                log.write("sample", pid=pid, t=t, rss=a + 200 * MiB, rss_anon=a,
                          rss_file=200 * MiB, **extra)
            values.append(a)
            log.write("epoch_end", pid=pid, t=t, epoch=epoch, rss=a + 200 * MiB, rss_anon=a,
                      rss_file=200 * MiB)
        if verdict:
            log.write("verdict", pid=pid, t=t, **classify(values).to_record())
    return values


def leak_then_restart(path: Path, *, seed: int = 0) -> None:
    """A realistic run under ``memfit run --max-rss 2.5GiB``: a supervisor, a child that leaks
    about 230 MiB an epoch until the supervisor restarts it, and a second child that resumes."""
    rng = random.Random(seed)
    with MemoryLog(path, source="run", header=False) as log:
        start(log, SUPERVISOR, source="run", command="memfit run --max-rss 2.5GiB -- python "
              "train.py --epochs 10", max_rss=MAX_RSS)
        sup_t = T0
        t = T0 + 1.5
        epoch_ends = []
        for child, epochs in ((CHILD1, range(0, 7)), (CHILD2, range(6, 10))):
            base = 1.05 * GiB
            # TensorFlow import and model build: anon climbs to the working level
            for i in range(6):
                t += 0.5
                a = 0.15 * GiB + (base - 0.15 * GiB) * (1 - math.exp(-i / 1.5))
                log.write("sample", pid=child, t=t, rss=int(a + 0.3 * GiB), rss_anon=int(a),
                          rss_file=int(0.18 * GiB + i * 0.02 * GiB))
            for k, epoch in enumerate(epochs):
                for step in range(40):
                    t += 0.5
                    a = base + k * 230 * MiB + step * 5.5 * MiB + rng.gauss(0, 12 * MiB)
                    a += 90 * MiB * math.sin(step / 40 * math.pi)    # shuffle buffer fills
                    f = 0.3 * GiB + rng.gauss(0, 4 * MiB)
                    cur = 3.1 * GiB + 0.6 * GiB * (step % 8) / 8 + rng.gauss(0, 20 * MiB)
                    log.write("sample", pid=child, t=t, rss=int(a + f), rss_anon=int(a),
                              rss_file=int(f), gpu={"GPU:0": {"current": int(cur),
                                                              "peak": int(4.1 * GiB)}},
                              nvml=int(5.3 * GiB))
                    while sup_t + 5 < t:
                        sup_t += 5
                        log.write("sample", pid=SUPERVISOR, t=sup_t, rss=int(95 * MiB),
                                  rss_anon=int(48 * MiB + rng.gauss(0, MiB)),
                                  rss_file=int(46 * MiB))
                    if a > MAX_RSS:
                        break
                if a > MAX_RSS:
                    log.write("restart", pid=SUPERVISOR, t=t + 0.1,
                              reason="anonymous RSS 2.5 GiB > --max-rss 2.5 GiB", child=child,
                              epoch=epoch)
                    log.write("exit", pid=child, t=t + 0.2, code=-9,
                              reason="stopped by the supervisor")
                    t += 2.5                                          # restart overhead
                    break
                log.write("epoch_end", pid=child, t=t, epoch=epoch, rss=int(a + f),
                          rss_anon=int(a), rss_file=int(f))
                if child == CHILD1:
                    epoch_ends.append(a)
        log.write("verdict", pid=SUPERVISOR, t=t + 0.1, **classify(epoch_ends).to_record())
        log.write("exit", pid=CHILD2, t=t + 0.2, code=0)
        log.write("stop", pid=SUPERVISOR, t=t + 0.4, reason="training finished (10 epochs)")

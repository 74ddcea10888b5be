"""GPU check, ready to run on a lent GPU machine with JAX and Keras (no TensorFlow needed).

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/gpu_check.py      # here: runs, measures nothing
    python benchmarks/gpu_check.py --jobs 2 --fraction 0.3            # on the GPU machine

One short call (well under 5 minutes on a GPU). It starts ``--jobs`` small Keras trainings
on the JAX backend at once, on one device, each with a cap in the form JAX obeys (what
``memfit share`` hands a JAX job): ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (JAX would
otherwise take 75 % of the card at start-up, and the second job would fail) and
``XLA_PYTHON_CLIENT_MEM_FRACTION`` = the job's share of the card. Each training has a
``memfit.MemoryMonitor``. While they run this process samples NVML's memory per process
(:func:`memfit.memory.probe.nvml_devices`). At the end it prints, per job:

- the cap (fraction x the card's memory), and whether it held: JAX's allocator peak
  (``device.memory_stats()["peak_bytes_in_use"]``) within its ``bytes_limit``, and NVML's
  per-process peak, which adds the CUDA context and libraries on top, against the cap;
- ``MemoryMonitor``'s device figures (the ``gpu`` field of its log, read from the same
  allocator statistics) against the training's own last ``memory_stats()``.

Without a GPU (``JAX_PLATFORMS=cpu``, or none visible) it runs the same trainings on the
CPU and says so: no GPU, nothing measured; it exits 0 (tests/test_gpu_check.py runs it
so). It exits 1 when a training fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def jax_cap_env(fraction: float) -> dict[str, str]:
    """The environment that caps one JAX process at ``fraction`` of its device."""
    return {PREALLOCATE_ENV: "false", FRACTION_ENV: f"{fraction:.3f}"}


def child(out: Path, epochs: int, width: int) -> None:
    """One training (run in its own process): writes its figures to ``out``."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np

    import memfit

    rng = np.random.default_rng(os.getpid() % 1000)
    x = rng.normal(size=(4096, 256)).astype("float32")
    y = rng.normal(size=(4096, 1)).astype("float32")
    model = keras.Sequential([keras.Input((256,)),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    monitor = memfit.MemoryMonitor(out.parent / f"{out.stem}-wd", every_n_batches=8,
                                   verbose=0)
    model.fit(x, y, batch_size=256, epochs=epochs, callbacks=[monitor], verbose=0)
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    out.write_text(json.dumps({
        "pid": os.getpid(), "platform": device.platform, "device": str(device),
        "peak": stats.get("peak_bytes_in_use"), "in_use": stats.get("bytes_in_use"),
        "limit": stats.get("bytes_limit"), "tensorflow": "tensorflow" in sys.modules,
        "log": str(monitor.log_path), "verdict": monitor.verdict.kind}))


def monitor_peak(log: Path) -> int | None:
    """The highest device peak MemoryMonitor logged (its records' ``gpu`` field)."""
    from memfit.memory.log import read_log

    peaks = [info.get("peak") for r in read_log(log)
             for info in (r.get("gpu") or {}).values() if isinstance(info, dict)]
    return max((p for p in peaks if p is not None), default=None)


def fmt(value: int | None) -> str:
    from memfit.sizes import format_size

    return "n/a" if value is None else format_size(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2, help="trainings at once (default 2)")
    p.add_argument("--fraction", type=float, help="each job's share of the device "
                   "(default: 0.9 / jobs)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--width", type=int, default=1024, help="units of the hidden layers")
    p.add_argument("--workdir", type=Path, help="keep the jobs' files here")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.epochs, args.width)
        return 0
    from memfit.memory.probe import nvml_devices

    fraction = args.fraction or 0.9 / args.jobs
    started = time.time()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="memfit-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    devices = nvml_devices() or []
    total = devices[0]["total"] if devices else None
    env = {**os.environ, "KERAS_BACKEND": "jax", **jax_cap_env(fraction)}
    procs = []
    for i in range(args.jobs):
        out = work / f"job{i}.json"
        procs.append((out, subprocess.Popen(
            [sys.executable, __file__, "--child", str(out), "--epochs", str(args.epochs),
             "--width", str(args.width)], env={**env, "MEMFIT_WORKDIR": str(work / f"job{i}")},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    nvml_peak: dict[int, int] = {}
    while any(proc.poll() is None for _, proc in procs):
        for _, proc in procs:
            for device in nvml_devices(proc.pid) or []:
                if device["own"] is not None:
                    nvml_peak[proc.pid] = max(nvml_peak.get(proc.pid, 0), device["own"])
        time.sleep(0.2)
    failed = 0
    jobs = []
    for out, proc in procs:
        err = proc.stderr.read().decode(errors="replace")
        if proc.wait() != 0 or not out.exists():
            failed += 1
            print(f"job {out.stem} failed (exit {proc.returncode}): {err[-1500:]}",
                  file=sys.stderr)
            continue
        jobs.append(json.loads(out.read_text()))
    gpu = bool(jobs) and all(j["platform"] == "gpu" for j in jobs)
    print(f"# memfit GPU check ({time.strftime('%Y-%m-%d')}): {args.jobs} JAX trainings at "
          f"once, each capped at {fraction:.0%} ({PREALLOCATE_ENV}=false, "
          f"{FRACTION_ENV}={fraction:.3f})")
    if not gpu:
        print(f"\nno GPU: JAX ran on {jobs[0]['platform'] if jobs else 'nothing'}, so "
              f"nothing was measured (device memory, caps and MemoryMonitor's device "
              f"figures need a GPU); the trainings ran end to end on the CPU.")
    cap = int(fraction * total) if total else None
    print("\n| job | cap | JAX peak / limit | allocator held its limit | NVML per process "
          "| NVML within the cap | MemoryMonitor device peak | JAX memory_stats peak |")
    print("|---|---|---|---|---|---|---|---|")
    for i, job in enumerate(jobs):
        held = "n/a" if job["peak"] is None or not job["limit"] else \
            ("yes" if job["peak"] <= job["limit"] else "NO")
        nvml = nvml_peak.get(job["pid"])
        within = "n/a" if nvml is None or cap is None else ("yes" if nvml <= cap else
                                                             f"no (+{fmt(nvml - cap)})")
        print(f"| {i} | {fmt(cap)} | {fmt(job['peak'])} / {fmt(job['limit'])} | {held} | "
              f"{fmt(nvml)} | {within} | {fmt(monitor_peak(Path(job['log'])))} | "
              f"{fmt(job['peak'])} |")
    tf = [j for j in jobs if j["tensorflow"]]
    print(f"\nMemoryMonitor verdicts: {', '.join(j['verdict'] for j in jobs) or 'none'}; "
          f"TensorFlow imported by {len(tf)} of {len(jobs)} trainings; "
          f"{time.time() - started:.0f} s; files in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU check: memfit's device claims measured on a lent GPU through Keras on JAX (no TensorFlow).

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/gpu_check.py --quick  # runs, measures nothing
    python benchmarks/gpu_check.py --out $OUT                           # on the GPU machine

One call, about five minutes on a GPU. Five parts (``--parts``, all by default):

``estimate``
    XLA's estimate (:class:`memfit.estimate.xla.XlaEstimator`) against the device
    allocator's measured peak (``device.memory_stats()["peak_bytes_in_use"]`` after three
    steps of the very program XLA analysed), for the family panel
    (``estimate_family_models.py``) at 8 times its largest batch, each case in its own
    process (12 at a time). Nothing of the estimate is fitted on these cases: every one
    of them is held out.
``search``
    ``memfit find-batch-size`` on the device: each trial a child whose allocator is held
    to the budget; a batch that does not fit fails with a real device OOM.
``monitor``
    ``MemoryMonitor``'s device verdict for three trainings: one that keeps device arrays
    every epoch (a leak), one that holds a large array from the start (a level), one that
    makes and frees growing temporaries (the allocator keeps the pool: retention).
``share``
    four JAX trainings under ``memfit share`` on the card, each capped at its share in the
    form JAX obeys (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``), with NVML's per-process memory polled against
    each job's charge;
``nomemfit``
    the same four without memfit, at JAX's defaults (75 % of the card taken at start-up).

share, nomemfit and search run first, one after another, each with the card to itself; then
estimate and monitor side by side. Markdown tables go to standard
output and to ``OUT/gpu_check.md``, the raw figures to ``OUT/gpu_check.json`` (rewritten
after each part, so a run cut short keeps what it measured). Without a GPU
(``JAX_PLATFORMS=cpu``, or none visible) every part runs on the CPU and the output says that
nothing was measured on a device; it exits 0 (tests/test_gpu_check.py runs it so), 1 when a
part failed to run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
MODELS = HERE.with_name("estimate_family_models.py")
XLA_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")
GIB = 2**30


def fmt(value: float | None) -> str:
    from memfit.sizes import format_size

    return "n/a" if value is None else format_size(int(value))


# -- children ------------------------------------------------------------------------------

def child_train(a: argparse.Namespace) -> None:
    """One Keras training on JAX with a MemoryMonitor; optionally leaks device arrays
    (``--leak-mib`` kept each epoch), holds a level (``--level-mib`` from the start) or
    churns (a temporary of epoch x ``--churn-mib`` made and freed each epoch)."""
    out = Path(a.out)
    out.with_suffix(".pid").write_text(str(os.getpid()))
    import jax
    import keras
    import numpy as np

    import memfit
    from memfit.memory.probe import jax_device_memory, nvml_memory

    kept = []

    class Pressure(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if a.level_mib:
                kept.append(jax.numpy.ones(a.level_mib * 2**18, "float32"))

        def on_epoch_end(self, epoch, logs=None):
            if a.leak_mib:
                kept.append(jax.numpy.full(a.leak_mib * 2**18, epoch, "float32"))
            if a.churn_mib:
                t = jax.numpy.ones((epoch + 1) * a.churn_mib * 2**18, "float32")
                t.block_until_ready()
                del t

    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.batch * a.steps, a.width)).astype("float32")
    y = rng.normal(size=(a.batch * a.steps, 1)).astype("float32")
    model = keras.Sequential([keras.Input((a.width,))]
                             + [keras.layers.Dense(a.width, activation="relu")
                                for _ in range(3)] + [keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    monitor = memfit.MemoryMonitor(out.parent / f"{out.stem}-wd", every_n_batches=4,
                                   verbose=0)
    # The pressure callback runs before the monitor samples the epoch's end.
    model.fit(x, y, batch_size=a.batch, epochs=a.epochs, callbacks=[Pressure(), monitor],
              verbose=0)
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    out.write_text(json.dumps({
        "pid": os.getpid(), "platform": device.platform, "device": str(device),
        "peak": stats.get("peak_bytes_in_use"), "in_use": stats.get("bytes_in_use"),
        "limit": stats.get("bytes_limit"), "tensorflow": "tensorflow" in sys.modules,
        "nvml_end": nvml_memory(), "gpu": jax_device_memory(),
        "fraction": os.environ.get(XLA_ENV[1]), "log": str(monitor.log_path),
        "verdict": monitor.verdict.kind if monitor.verdict else None,
        "device_verdict": (monitor.device_verdict.kind if monitor.device_verdict
                           else None),
        "device_in_use": monitor.device_in_use, "device_held": monitor.device_held}))


def child_panel(a: argparse.Namespace) -> None:
    """One panel case: XLA's estimate, then three real steps of the same model in this
    process, and the device allocator's peak."""
    import jax

    from memfit.estimate.training import make_batch
    from memfit.estimate.xla import XlaEstimator, training_state

    spec = json.loads(a.spec)
    shape = tuple(spec["input_shape"]) if spec.get("input_shape") else None
    est = XlaEstimator(f"{MODELS}:{spec['name']}", optimizer="adam", input_shape=shape,
                       device="gpu:0" if jax.devices()[0].platform == "gpu" else "cpu")
    b = int(spec["batch"])
    built_peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    step = est.step(b)
    predicted = est.model_bytes(b)
    # What the point was before it took the compile-time peak (the first H200 run's).
    xla_only = max(step.total, est.exact(b))
    # Runs the very program whose memory XLA analysed (compiled once), three times, as
    # Keras's JAX trainer runs it: the state donated, the batch on the device.
    program = est.program(b)
    state = training_state(est.setup.model)
    x, y = make_batch(est.setup, b)
    data = (jax.device_put(x), jax.device_put(y), None)
    t = time.perf_counter()
    for _ in range(3):
        _, state = program(state, data)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t
    stats = jax.local_devices()[0].memory_stats() or {}
    print("GPUCHECK " + json.dumps({
        **spec, "predicted": predicted, "xla_only": xla_only, "built_peak": built_peak,
        "compile_peak": est.compile_peak(b), "low": est.low(b) - est.baseline,
        "high": est.high(b) - est.baseline, "exact": est.exact(b), "xla": step.to_json(),
        "measured": stats.get("peak_bytes_in_use"), "in_use": stats.get("bytes_in_use"),
        "platform": jax.devices()[0].platform, "seconds": seconds}))


def _child_env(**extra: str) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONUNBUFFERED": "1", **extra}
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def _capped_env() -> dict:
    """The parts that share the card with each other: JAX allocates as it needs."""
    return _child_env(XLA_PYTHON_CLIENT_PREALLOCATE="false")


def _train_cmd(out: Path, a: argparse.Namespace, **kw: int) -> list[str]:
    cmd = [sys.executable, str(HERE), "--child", "train", "--out", str(out),
           "--width", str(a.width), "--batch", str(a.batch), "--epochs", str(a.epochs),
           "--steps", str(a.steps)]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


# -- parts ---------------------------------------------------------------------------------

def part_estimate(a: argparse.Namespace, work: Path) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from estimate_family_models import FAMILIES

    cases = []
    for family, models in FAMILIES.items():
        for name, batches, shape in models:
            sizes = [batches[-1] * (1 if a.quick else 8)]
            cases += [{"family": family, "name": name, "batch": b,
                       "input_shape": list(shape) if shape else None} for b in sizes]
    if a.quick:
        cases = [c for c in cases if c["name"] in ("lenet", "gru", "mlp_deep")]

    deadline = time.time() + a.deadline

    def run(case: dict) -> dict:
        if time.time() > deadline:
            return {**case, "error": "not run: the check's time was up"}
        try:
            done = subprocess.run([sys.executable, str(HERE), "--child", "panel", "--spec",
                                   json.dumps(case)], env=_capped_env(), capture_output=True,
                                  text=True, timeout=max(5.0, min(a.case_timeout,
                                                                  deadline + 30 - time.time())))
        except subprocess.TimeoutExpired:
            return {**case, "error": "timed out (compiling, most likely)"}
        for line in done.stdout.splitlines():
            if line.startswith("GPUCHECK "):
                return json.loads(line[len("GPUCHECK "):])
        tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-1:] or ["?"]
        oom = "RESOURCE_EXHAUSTED" in done.stderr
        return {**case, "error": ("device OOM: " if oom else "") + tail[0][-300:]}

    # The slowest to compile last, so that a cut-off leaves every family covered.
    slow = ("resnet50v2_small", "wide_resnet", "unet_96", "mobilenet_v3_small")
    cases.sort(key=lambda c: c["name"] in slow)
    with ThreadPoolExecutor(a.parallel) as pool:
        results = list(pool.map(run, cases))
    ok = [r for r in results if r.get("measured")]
    lines = ["| family | model | batch | XLA step | peak while compiling | estimate | range | "
             "measured peak | measured ÷ estimate | in range |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if not r.get("measured"):
            estimate = (f"{fmt(r['predicted'])} | {fmt(r['low'])} – {fmt(r['high'])}"
                        if "predicted" in r else " | ")
            lines.append(f"| {r['family']} | {r['name']} | {r['batch']} | | | {estimate} | "
                         f"{r.get('error', 'no device figure')} | | |")
            continue
        ratio = r["measured"] / r["predicted"]
        inside = "yes" if r["low"] <= r["measured"] <= r["high"] else (
            "ABOVE" if r["measured"] > r["high"] else "below")
        lines.append(f"| {r['family']} | {r['name']} | {r['batch']} | {fmt(r['xla_only'])} "
                     f"| {fmt(r['compile_peak'])} | {fmt(r['predicted'])} "
                     f"| {fmt(r['low'])} – {fmt(r['high'])} | {fmt(r['measured'])} | "
                     f"{ratio:.3f} | {inside} |")
    summary = {}
    if ok:
        errors = [abs(r["measured"] / r["predicted"] - 1) for r in ok]
        ratios = [r["measured"] / r["predicted"] for r in ok]
        summary = {"cases": len(ok), "failed": len(results) - len(ok),
                   "mre": statistics.mean(errors), "median_ratio": statistics.median(ratios),
                   "min_ratio": min(ratios), "max_ratio": max(ratios),
                   "under": sum(x > 1 for x in ratios) / len(ok),
                   "above_high": sum(r["measured"] > r["high"] for r in ok)}
        lines.append(f"\n{len(ok)} cases ({len(results) - len(ok)} without a figure): mean "
                     f"relative error {summary['mre']:.1%}; measured ÷ estimate median "
                     f"{summary['median_ratio']:.3f} (min {summary['min_ratio']:.3f}, max "
                     f"{summary['max_ratio']:.3f}); under-estimated {summary['under']:.0%}; "
                     f"above the high end: {summary['above_high']}")
    return {"table": "\n".join(lines), "results": results, "summary": summary}


def part_search(a: argparse.Namespace, work: Path) -> dict:
    """find-batch-size on the device (on the CPU: a host budget), in a child of its own
    (so that it runs under KERAS_BACKEND=jax)."""
    targets = ([("mlp_deep", "900MiB")] if a.quick else
               [("vgg_tiny", "2GiB")])
    rows, raw = [], []
    for name, budget in targets:
        out = work / f"search-{name}.json"
        cmd = [sys.executable, "-m", "memfit", "find-batch-size", f"{MODELS}:{name}",
               "--budget", budget, "--precision", "0.03", "--json", "--device",
               "gpu:0" if a.gpu else "cpu", "--max-trials", "4" if a.quick else "6"]
        t = time.time()
        done = subprocess.run(cmd, env=_capped_env(), capture_output=True, text=True,
                              timeout=a.case_timeout * 4)
        try:
            r = json.loads(done.stdout)
        except ValueError:
            rows.append(f"| {name} | {budget} | failed: {done.stderr.strip()[-300:]} | | | |")
            continue
        out.write_text(json.dumps(r))
        raw.append(r)
        trials = ", ".join(f"{t_['batch_size']} {t_['status']}" for t_ in r["trials"])
        ooms = sum(t_["status"] == "oom" for t_ in r["trials"])
        rows.append(f"| {name} | {budget} | {r['estimated']} | {r['batch_size']} "
                    f"(smallest failing {r['smallest_failing']}) | {len(r['trials'])} "
                    f"({ooms} device OOMs): {trials} | {time.time() - t:.0f} s |")
    table = ("| model | budget | estimate's largest batch | found | trials | time |\n"
             "|---|---|---:|---|---|---:|\n" + "\n".join(rows))
    return {"table": table, "results": raw}


def part_monitor(a: argparse.Namespace, work: Path) -> dict:
    scale = 1 if a.quick else 16
    cases = {"leak": {"leak_mib": 64 * scale}, "level": {"level_mib": 256 * scale},
             "churn": {"churn_mib": 64 * scale}}
    procs = {}
    for name, kw in cases.items():
        out = work / f"monitor-{name}.json"
        procs[name] = (out, subprocess.Popen(_train_cmd(out, a, epochs=8, **kw),
                                             env=_capped_env(), stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True))
    rows, raw = [], {}
    for name, (out, proc) in procs.items():
        err = proc.communicate(timeout=a.case_timeout * 2)[1]
        if proc.returncode != 0 or not out.exists():
            rows.append(f"| {name} | failed (exit {proc.returncode}): "
                        f"{err.strip()[-300:]} | | | |")
            continue
        r = json.loads(out.read_text())
        raw[name] = r
        in_use = ", ".join(f"{v / 2**20:.0f}" for v in r["device_in_use"]) or "n/a"
        held = ", ".join(f"{v / 2**20:.0f}" for v in r["device_held"]) or "n/a"
        rows.append(f"| {name} | {r['device_verdict'] or 'n/a (no device figures)'} | "
                    f"{r['verdict']} | {in_use} | {held} |")
    try:
        from memfit.report import write_report

        if "leak" in raw:
            written = write_report(Path(raw["leak"]["log"]).parent)
            raw["leak_report"] = str(written)
    except Exception as e:       # noqa: BLE001
        raw["report_error"] = f"{type(e).__name__}: {e}"
    table = ("| training | device verdict | host verdict | device bytes in use at epoch "
             "ends (MiB) | NVML per process at epoch ends (MiB) |\n|---|---|---|---|---|\n"
             + "\n".join(rows))
    return {"table": table, "results": raw}


class NvmlPoller(threading.Thread):
    """Polls NVML's per-process device memory of the trainings that wrote their pid."""

    def __init__(self, work: Path, pattern: str):
        super().__init__(daemon=True)
        self.work, self.pattern = work, pattern
        self.peak: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        from memfit.memory.probe import nvml_devices

        while not self.stop.is_set():
            for pid_file in self.work.glob(self.pattern):
                try:
                    pid = int(pid_file.read_text())
                except ValueError:
                    continue
                for device in nvml_devices(pid) or []:
                    if device["own"] is not None:
                        self.peak[pid] = max(self.peak.get(pid, 0), device["own"])
            time.sleep(0.1)


def _card_total() -> int | None:
    from memfit.memory.probe import nvml_devices

    devices = nvml_devices() or []
    return devices[0]["total"] if devices else None


def part_share(a: argparse.Namespace, work: Path) -> dict:
    share_dir = work / "share"
    share_dir.mkdir(parents=True, exist_ok=True)
    need = "256MiB" if a.quick else "4GiB"
    overhead_note = "default"
    if a.gpu:
        try:
            from memfit.estimate.baseline import calibrate

            os.environ["KERAS_BACKEND"] = "jax"
            c = calibrate("gpu:0", runs=1)
            overhead_note = f"calibrated on JAX: {fmt(c.baseline)}"
        except Exception as e:      # noqa: BLE001
            overhead_note = f"calibration failed ({type(e).__name__}: {e}); default"
    jobs = share_dir / "jobs.toml"
    with open(jobs, "w") as f:
        for i in range(4):
            out = share_dir / f"job{i}.json"
            f.write(f'[[job]]\nname = "job{i}"\nneed = "{need}"\ncommand = '
                    f'{json.dumps(_train_cmd(out, a))}\n\n')
    from memfit.estimate.baseline import framework_baseline
    from memfit.sizes import parse_size

    overhead, source = framework_baseline("gpu:0" if a.gpu else "cpu")
    budget = 4 * (parse_size(need) + overhead)
    poller = NvmlPoller(share_dir, "job*.pid")
    poller.start()
    t = time.time()
    done = subprocess.run([sys.executable, "-m", "memfit", "share", str(jobs), "--device",
                           "gpu:0" if a.gpu else "cpu", "--budget", str(budget),
                           "--workdir", str(share_dir / "wd")], env=_child_env(),
                          capture_output=True, text=True, timeout=a.case_timeout * 4)
    poller.stop.set()
    poller.join()
    total = _card_total()
    rows, raw = [], []
    cap = parse_size(need)
    for i in range(4):
        out = share_dir / f"job{i}.json"
        if not out.exists():
            rows.append(f"| job{i} | did not finish | | | | |")
            continue
        r = json.loads(out.read_text())
        raw.append(r)
        nvml = poller.peak.get(r["pid"])
        charge = cap + overhead
        rows.append(f"| job{i} | {fmt(cap)} (fraction {r['fraction']}) | "
                    f"{fmt(r['peak'])} / {fmt(r['limit'])} | {fmt(nvml)} | {fmt(charge)} | "
                    f"{'n/a' if nvml is None else ('yes' if nvml <= charge else 'NO')} |")
    head = (f"memfit share: exit {done.returncode} in {time.time() - t:.0f} s; budget "
            f"{fmt(budget)} (4 × (need {need} + per-process overhead {fmt(overhead)}, "
            f"{source}; {overhead_note})); card {fmt(total)}; JAX's default would take "
            f"75 % = {fmt(0.75 * total) if total else 'n/a'} per process, 4 × = "
            f"{fmt(3 * total) if total else 'n/a'}")
    table = (head + "\n\n| job | cap handed to JAX | JAX allocator peak / limit | NVML per "
             "process, peak | charge (need + overhead) | NVML within the charge |\n"
             "|---|---|---|---|---|---|\n" + "\n".join(rows))
    if done.returncode != 0:
        table += f"\n\nshare's output: {(done.stdout + done.stderr).strip()[-800:]}"
    return {"table": table, "results": raw, "returncode": done.returncode,
            "budget": budget, "overhead": overhead, "nvml_peak": poller.peak}


def part_nomemfit(a: argparse.Namespace, work: Path) -> dict:
    base = work / "nomemfit"
    base.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in _child_env().items() if k not in XLA_ENV}
    poller = NvmlPoller(base, "job*.pid")
    poller.start()
    procs = []
    for i in range(4):
        out = base / f"job{i}.json"
        procs.append((out, subprocess.Popen(_train_cmd(out, a), env=env,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True)))
        time.sleep(2.0)            # each starts once the one before has its memory
    rows = []
    failed = 0
    for i, (out, proc) in enumerate(procs):
        err = proc.communicate(timeout=a.case_timeout * 2)[1]
        pid = int(out.with_suffix(".pid").read_text()) if out.with_suffix(".pid").exists() \
            else None
        ok = proc.returncode == 0 and out.exists()
        failed += not ok
        why = ""
        if not ok:
            lines = [ln for ln in err.splitlines() if "RESOURCE_EXHAUSTED" in ln
                     or "out of memory" in ln.lower()] or err.strip().splitlines()[-1:]
            why = (lines[0] if lines else "?").strip()[-200:]
        rows.append(f"| job{i} | {'ran' if ok else 'FAILED'} (exit {proc.returncode}) | "
                    f"{fmt(poller.peak.get(pid) if pid else None)} | {why} |")
    poller.stop.set()
    poller.join()
    table = (f"{failed} of 4 trainings failed at JAX's defaults.\n\n| job | outcome | NVML "
             "per process, peak | error |\n|---|---|---|---|\n" + "\n".join(rows))
    return {"table": table, "failed": failed}


PARTS = {"share": part_share, "nomemfit": part_nomemfit, "search": part_search,
         "estimate": part_estimate, "monitor": part_monitor}
# The search ran side by side with the panel on the first H200 and did not finish: it runs
# alone now, after share and nomemfit, before the rest.
SIDE_BY_SIDE = ("estimate", "monitor")
TITLES = {"estimate": "XLA's estimate against the device's measured peak (family panel)",
          "search": "find-batch-size on the device, real OOMs",
          "monitor": "MemoryMonitor's device verdicts",
          "share": "Four trainings under memfit share",
          "nomemfit": "The same four without memfit (JAX's defaults)"}


def _gpu_visible() -> bool:
    """Whether the children's JAX will run on a GPU: NVML sees one and JAX is not held to
    the CPU. This process never imports JAX (it would take the card's memory)."""
    from memfit.memory.probe import nvml_devices

    platforms = os.environ.get("JAX_PLATFORMS", "")
    return bool(nvml_devices()) and (not platforms or "cuda" in platforms
                                     or "gpu" in platforms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: "
                   + ", ".join(PARTS))
    p.add_argument("--out", type=Path, help="write gpu_check.md and gpu_check.json here")
    p.add_argument("--workdir", type=Path, help="keep the jobs' files here")
    p.add_argument("--quick", action="store_true", help="small sizes (the CPU test)")
    p.add_argument("--parallel", type=int, default=12, help="panel cases at once")
    p.add_argument("--case-timeout", type=float, default=120.0)
    p.add_argument("--deadline", type=float, default=150.0,
                   help="seconds after which the panel starts no more cases")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--child", choices=("train", "panel"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--leak-mib", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--level-mib", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--churn-mib", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child == "train":
        child_train(a)
        return 0
    if a.child == "panel":
        child_panel(a)
        return 0
    if a.quick:
        a.width, a.batch, a.steps = min(a.width, 64), min(a.batch, 32), min(a.steps, 4)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    os.environ["KERAS_BACKEND"] = "jax"
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    a.gpu = _gpu_visible()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="memfit-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    out = a.out or work
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict[str, dict] = {}
    lock = threading.Lock()
    head = [f"# memfit GPU check, {time.strftime('%Y-%m-%d')}", "",
            f"device: {'GPU ' + str(_card_name()) if a.gpu else 'none'}; JAX "
            f"{_version('jax')}, Keras {_version('keras')}; TensorFlow "
            f"{'imported' if 'tensorflow' in sys.modules else 'not imported'}"]
    if not a.gpu:
        head.append("\nno GPU: JAX ran on the cpu, so nothing was measured on a device; "
                    "every part ran end to end on the CPU.")

    def write() -> None:
        text = "\n".join(head) + "\n"
        for name in PARTS:
            if name in results:
                text += f"\n## {TITLES[name]}\n\n{results[name].get('table', '')}\n"
        (out / "gpu_check.md").write_text(text)
        (out / "gpu_check.json").write_text(json.dumps(results, default=str, indent=1))

    def run(name: str) -> None:
        t = time.time()
        try:
            r = PARTS[name](a, work)
        except Exception as e:       # noqa: BLE001
            r = {"table": f"part failed: {type(e).__name__}: {e}",
                 "error": traceback.format_exc()[-3000:]}
        r["seconds"] = round(time.time() - t, 1)
        with lock:
            results[name] = r
            write()
        print(f"[{time.time() - started:5.0f} s] {name} done in {r['seconds']} s",
              file=sys.stderr, flush=True)

    # The card to themselves first (without memfit, JAX takes 75 % of it), then the rest
    # side by side.
    for name in parts:
        if name not in SIDE_BY_SIDE:
            run(name)
    threads = [threading.Thread(target=run, args=(n,)) for n in parts if n in SIDE_BY_SIDE]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    write()
    print((out / "gpu_check.md").read_text())
    print(f"{time.time() - started:.0f} s; files in {work}")
    return 1 if any("error" in r for r in results.values()) else 0


def _card_name() -> str:
    from memfit.memory.probe import nvml_devices

    devices = nvml_devices() or []
    return f"{devices[0]['name']} ({fmt(devices[0]['total'])})" if devices else "?"


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


if __name__ == "__main__":
    sys.exit(main())

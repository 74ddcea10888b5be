"""The measuring child: ``python -m memfit.estimate.child '<json request>'``.

Run by :mod:`memfit.estimate.measure` (never by hand), in a fresh process so that a model
that does not fit can be killed without harm to the parent. It reports on stdout, one
JSON object per line behind the marker ``MEMFIT-CHILD`` (:mod:`memfit.estimate.child_protocol`):

``{"event": "baseline", ...}``
    after ``import tensorflow, keras`` (on Keras's JAX backend ``import jax, keras``) and
    one eager op: the framework baseline, the
    point every measured number is relative to (anonymous RSS, from the one probe).
``{"event": "result", ...}``
    after the training steps: ``peak_anon`` (the peak anonymous RSS from model load to
    the end of the last step), ``measured`` (``peak_anon - baseline_anon``), the
    anonymous RSS after compile and after the first step, step times, ``step_peaks``
    (the peak so far after each step, over the baseline: how fast it settles) and
    ``allocator`` (the allocator policy it ran under, see :mod:`memfit.memory.allocator`).
``{"event": "error", ...}``
    a clear error (bad model...) or an out-of-memory error from TensorFlow.

Requests: ``{"mode": "train", "model": {...}, "batch_size": 32, "dtype_policy": null,
"optimizer": "adam", "steps": 4}`` (on a GPU under JAX, ``"device_limit"``: the
device bytes it may use, handed to JAX as its memory fraction), ``{"mode":
"calibrate"}``, or ``{"mode": "estimate", ...}`` (the estimate, made in the child:
``find-batch-size`` never builds a model itself). A child started as a new interpreter is
given ``"parent"``, its starter's pid: it dies with it (:mod:`memfit.lifeline`), so that a
killed ``find-batch-size --cold`` leaves no training behind, held to the budget by nobody
(a forked child is tied by its warm parent).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from memfit.errors import cause
from memfit.estimate.child_protocol import Report, emit
from memfit.estimate.model import EstimateError, ModelSpec
from memfit.estimate.training import make_batch, prepare
from memfit.frameworks import keras_backend
from memfit.lifeline import die_with_parent
from memfit.memory.allocator import current_policy
from memfit.memory.probe import jax_device_memory, measure, nvml_memory, sample, tf_gpu_memory


def _cap_jax(request: dict) -> None:
    """Hands a JAX child its device limit (``device_limit``, bytes) in the form JAX
    obeys, before JAX starts: no preallocation, that share of the card."""
    limit = request.get("device_limit")
    if not limit or not str(request.get("device", "cpu")).startswith("gpu"):
        return
    from memfit.device import device_env
    from memfit.memory.probe import nvml_devices

    devices = nvml_devices() or []
    index = int(str(request["device"]).split(":")[1])
    total = devices[index]["total"] if index < len(devices) else None
    os.environ.update(device_env(memory_limit=int(limit), card_total=total))


def _jax_baseline(device: str, before_import: Any) -> dict:
    """The baseline on Keras's JAX backend: ``import jax, keras`` and one op on the
    device (its runtime, and on a GPU its allocator and the CUDA context, started)."""
    import jax
    import keras

    # A matmul and a convolution, so that the libraries every training loads (cuBLAS,
    # cuDNN on a GPU) are in: the H200 run charged a training ~250 MiB more than a
    # baseline taken after one addition (docs/gpu.md).
    a = jax.numpy.ones((64, 64))
    (a @ a + 1.0).block_until_ready()
    jax.lax.conv(jax.numpy.ones((1, 1, 8, 8)), jax.numpy.ones((1, 1, 3, 3)),
                 (1, 1), "SAME").block_until_ready()
    s = sample()
    out = {"baseline_anon": s.anon_or_total, "baseline_rss": s.rss,
           "interpreter_anon": before_import.anon_or_total, "device": device,
           "backend": "jax", "tensorflow": "-", "jax": jax.__version__,
           "platform": jax.devices()[0].platform, "keras": keras.__version__}
    if device.startswith("gpu"):
        out["nvml"] = nvml_memory()
    return out


def _framework_baseline(device: str) -> dict:
    before_import = sample()
    if keras_backend() == "jax":
        return _jax_baseline(device, before_import)
    import keras  # noqa: F401
    import tensorflow as tf

    if device.startswith("gpu"):
        # Memory growth: otherwise TensorFlow's first op reserves most of the card, and
        # NVML would charge all of it to the process as its "baseline".
        from memfit.device import configure_device

        configure_device(growth=True)
    with tf.device("/GPU:0" if device.startswith("gpu") else "/CPU:0"):
        (tf.constant([1.0]) + 1.0).numpy()         # starts the runtime and its thread pools
    s = sample()
    out = {"baseline_anon": s.anon_or_total, "baseline_rss": s.rss,
           "interpreter_anon": before_import.anon_or_total, "device": device,
           "tensorflow": tf.__version__, "keras": keras.__version__}
    if device.startswith("gpu"):
        out["nvml"] = nvml_memory()
    return out


def _gpu_peak() -> int | None:
    info = tf_gpu_memory() or jax_device_memory()
    if not info:
        return None
    return max(v["peak"] for v in info.values())


def _running_peak(s: Any) -> int:
    """The peak anonymous RSS so far: the kernel's high-water mark of total RSS (reset
    when the measurement began) less the file-backed pages, else the current value."""
    if s.rss_peak is not None and s.rss_file is not None and s.rss_anon is not None:
        return max(s.rss_anon, s.rss_peak - s.rss_file - (s.rss_shmem or 0))
    return s.anon_or_total


def train(request: dict) -> None:
    """Measures the peak memory of a few training steps (see the module docstring)."""
    device = request.get("device", "cpu")
    _cap_jax(request)
    base = _framework_baseline(device)       # first: it samples before the framework is in
    emit(Report.BASELINE, **base)
    try:
        with measure(interval=0.005) as m:
            steps = _train_steps(request, base["baseline_anon"])
    except EstimateError as e:
        emit(Report.ERROR, kind="input", message=str(e))
        sys.exit(2)
    except Exception as e:      # noqa: BLE001
        if not _out_of_memory(e):
            raise
        emit(Report.ERROR, kind="oom", message=f"{cause(e)}")
        sys.exit(3)
    emit(Report.RESULT, **_train_result(m, base, steps, device))


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is the framework running out of memory: TensorFlow's
    ``ResourceExhaustedError``, XLA's ``RESOURCE_EXHAUSTED`` (JAX), or Python's
    ``MemoryError``."""
    if isinstance(e, MemoryError) or type(e).__name__ == "ResourceExhaustedError":
        return True
    return "RESOURCE_EXHAUSTED" in str(e)[:200] or "Out of memory" in str(e)[:300]


def _train_steps(request: dict, baseline_anon: int) -> dict:
    """Loads and compiles the model, then runs the training steps asked for: what each
    left behind (anonymous RSS after compile and after the first step, step times, the
    peak so far after each step over the baseline)."""
    spec = ModelSpec.from_json(request["model"])
    batch_size = int(request["batch_size"])
    setup = prepare(spec, dtype_policy=request.get("dtype_policy"),
                    optimizer=request.get("optimizer"), input_shape=spec.input_shape)
    compiled = sample().anon_or_total
    x, y = make_batch(setup, batch_size)
    first = None
    times, step_peaks = [], []
    for _ in range(int(request.get("steps", 3))):
        t = time.perf_counter()
        setup.model.train_on_batch(x, y)
        times.append(time.perf_counter() - t)
        s = sample()
        if first is None:
            first = s.anon_or_total
        step_peaks.append(_running_peak(s) - baseline_anon)
    return {"compiled_anon": compiled, "first_step_anon": first, "step_seconds": times,
            "step_peaks": step_peaks, "policy": setup.policy, "batch_size": batch_size}


def _train_result(m: Any, base: dict, steps: dict, device: str) -> dict:
    """The ``result`` report of a training child: the peak from model load to the end
    of the last step (``m``: the measurement around them), over the baseline."""
    peak, after = m.peak, m.after
    assert peak is not None and after is not None
    peak_anon = peak.anon_or_total
    if peak.rss_anon is not None and after.rss_file is not None:
        # The kernel's high-water mark of total RSS catches spikes between two samples;
        # file-backed pages only grow during a run, so this bound is never too high.
        peak_anon = max(peak_anon, peak.rss - after.rss_file - (after.rss_shmem or 0))
    result = {"peak_anon": peak_anon, "measured": peak_anon - base["baseline_anon"],
              "baseline_anon": base["baseline_anon"], "compiled_anon": steps["compiled_anon"],
              "first_step_anon": steps["first_step_anon"], "after_anon": after.anon_or_total,
              "step_seconds": steps["step_seconds"], "step_peaks": steps["step_peaks"],
              "policy": steps["policy"], "allocator": current_policy(),
              "batch_size": steps["batch_size"], "samples": m.samples}
    if device.startswith("gpu"):
        result["gpu_peak"] = _gpu_peak()
        result["nvml"] = nvml_memory()
    return result


def estimate(request: dict) -> None:
    """Runs the estimator here (so that a parent never builds a model it cannot hold)."""
    from memfit.estimate.estimator import estimator_for  # only an estimating child needs it

    spec = ModelSpec.from_json(request["model"])
    try:
        est = estimator_for(spec, optimizer=request.get("optimizer"),
                            dtype_policy=request.get("dtype_policy"),
                            input_shape=spec.input_shape, device=request.get("device", "cpu"),
                            allocator=request.get("allocator", "default"))
        e = est.at(int(request.get("batch_size") or 1), budget=request.get("budget"))
        search = _search_hints(est, e) if e.budget is not None else {}
    except EstimateError as err:
        emit(Report.ERROR, kind="input", message=str(err))
        sys.exit(2)
    emit(Report.RESULT, **e.to_json(), **search)


def _search_hints(est: Any, e: Any) -> dict:
    """What ``find-batch-size`` starts from: the estimate's answers at each end of its range
    and at the point (largest batch whose low end, point, high end fits the budget), and its
    bytes a sample near the safe answer (to aim the next trial from a measured peak)."""
    from memfit.estimate.band import largest_batch

    b = max(1, e.max_batch_size or 1)
    aim = getattr(est, "interpolate", False)    # XLA's: each size tried is a compile
    return {"point_batch_size": largest_batch(est.total, e.budget, interpolate=aim),
            "low_batch_size": largest_batch(est.low, e.budget, interpolate=aim),
            "bytes_per_sample": (est.total(2 * b) - est.total(b)) / b}


def calibrate(request: dict) -> None:
    """Reports the framework baseline of this machine (see :mod:`baseline`)."""
    emit(Report.RESULT, **_framework_baseline(request.get("device", "cpu")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    request = json.loads(argv[0])
    if isinstance(request.get("parent"), int):
        die_with_parent(request["parent"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mode = request.get("mode", "train")
    if mode == "train":
        train(request)
    elif mode == "calibrate":
        calibrate(request)
    elif mode == "estimate":
        estimate(request)
    else:
        emit(Report.ERROR, kind="input", message=f"unknown mode {mode!r}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

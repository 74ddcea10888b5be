"""Measuring real training steps in a child process, safely.

:func:`run_child` starts ``python -m memfit.estimate.child`` with a request, watches the
child's whole process tree with the one process sampler
(:class:`memfit.memory.sampler.TreeSampler`) and kills it when its anonymous RSS passes
``budget``: a model that does not fit ends as ``"over-budget"``, never as an
out-of-memory kill of this process.

What is measured (CPU): the peak anonymous RSS of the training process from model load
to the end of the last training step, minus its anonymous RSS right after
``import tensorflow, keras`` and one eager op (the *framework baseline*). That delta is
what the estimate's model part predicts; baseline + delta is what the process needs.

Inside :func:`warm_children` (``find_batch_size`` runs its children so), a child on the
CPU is forked from a warm parent that imported the frameworks once
(:mod:`memfit.memory.warm`), instead of a new interpreter that imports them again: each
child of a search skips ``import tensorflow`` (4-10 s of CPU on a 2-core machine). The
child still starts its runtime with its first op, after the fork, and measures from
there: a forked child measures what a new interpreter measures
(``benchmarks/warm_children.py``). Where the warm parent cannot start, or dies, the
children start cold.

Example:
    >>> r = measure_training("mymodels:make_mlp", 64, dtype_policy="float32")  # doctest: +SKIP
    >>> r.status, r.measured                                                   # doctest: +SKIP
    ('ok', 51380224)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfit.device import XLA_PREALLOCATE_ENV
from memfit.errors import MemfitError
from memfit.estimate.child_protocol import Report, read_reports
from memfit.estimate.model import ModelSpec, check_batch_size, check_policy, parse_input_shape
from memfit.exitcodes import START_COLD
from memfit.frameworks import keras_backend, require_for_training
from memfit.memory.allocator import check_policy as check_allocator
from memfit.memory.allocator import policy_env
from memfit.memory.process import ticks
from memfit.memory.sampler import TreeSampler
from memfit.memory.warm import WarmChild, WarmParent, WarmStartError, cold_reason
from memfit.quiet import strip_noise

__all__ = ["ChildResult", "run_child", "measure_training", "warm_children"]

DEFAULT_TIMEOUT = 900.0
#: Training steps a measuring child runs by default. Under the ``"fixed"`` allocator
#: policy the peak is reached in the first two steps and stays (docs/estimate.md).
DEFAULT_STEPS = 4


@dataclasses.dataclass(frozen=True)
class ChildResult:
    """What one measuring child reported.

    Attributes:
        status: ``"ok"``; ``"over-budget"`` (killed by the parent: its anonymous RSS
            passed the budget); ``"oom"`` (TensorFlow or the kernel ran out of memory);
            ``"error"`` (bad input: ``message`` says what); ``"timeout"``; ``"crashed"``.
        measured: peak anonymous RSS over the framework baseline, in bytes (``ok`` only).
        peak: the child's peak anonymous RSS in bytes, as the child measured it (``ok``),
            else the largest the parent saw.
        baseline: the child's anonymous RSS after importing TensorFlow and Keras.
        report: everything the child reported (``result`` event).
        message: for errors, what went wrong.
        seconds: wall time of the child.
        started: ``"warm"`` (forked from a warm parent, see :func:`warm_children`) or
            ``"cold"`` (a new interpreter).
        cold_reason: why a child that was forked had to run again as a new interpreter
            (``"m.py sets TF_X='1' (...)"``), else ``None``.
    """

    status: str
    measured: int | None = None
    peak: int | None = None
    baseline: int | None = None
    report: dict = dataclasses.field(default_factory=dict)
    message: str = ""
    seconds: float = 0.0
    started: str = "cold"
    cold_reason: str | None = None

    @property
    def fits(self) -> bool:
        return self.status == "ok"


def _child_env(device: str, allocator: str = "default") -> dict:
    env = policy_env(allocator, dict(os.environ))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"     # measure the CPU even on a GPU machine
    elif device.startswith("gpu:"):
        env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        # JAX would take 75 % of the card at start-up, and NVML would charge it all.
        env.setdefault(XLA_PREALLOCATE_ENV, "false")
    return env


# Inside warm_children(): one warm parent per child environment (None: it could not
# start, or died; those children start cold).
_warm: dict[str, WarmParent | None] | None = None
_CHILD = "memfit.estimate.child"
# Requests a forked child may serve: a calibration measures the interpreter before the
# import, which a fork has already done.
_WARM_MODES = ("train", "estimate")


_cold = 0      # > 0 inside warm_children(False): children start cold for a while


@contextlib.contextmanager
def warm_children(enabled: bool = True) -> Iterator[None]:
    """Within the block, measuring children on the CPU are forked from a warm parent
    (started at the first child, one per environment, ended with the block) instead of
    starting as new interpreters. Nested blocks share the outer one's warm parents.

    Example:
        >>> with warm_children():                                       # doctest: +SKIP
        ...     a = measure_training("mymodels:make_mlp", 64)
        ...     b = measure_training("mymodels:make_mlp", 128)    # skips the import
        ...     with warm_children(False):
        ...         c = measure_training("mymodels:make_mlp", 128)   # a new interpreter

    Args:
        enabled: ``False``: children start as new interpreters within the block, and an
            outer block's warm parents wait for its end.
    """
    global _warm, _cold
    if not enabled:
        _cold += 1
        try:
            yield
        finally:
            _cold -= 1
        return
    if _warm is not None:
        yield
        return
    _warm = {}
    try:
        yield
    finally:
        parents, _warm = _warm, None
        for parent in parents.values():
            if parent is not None:
                parent.close()


def _warm_parent(request: dict, env: dict) -> WarmParent | None:
    """The warm parent for a child of ``request`` in ``env``, started if need be; ``None``
    outside :func:`warm_children`, on a GPU, or where it cannot start."""
    if _warm is None or _cold or request.get("device", "cpu") != "cpu" or \
            request.get("mode", "train") not in _WARM_MODES:
        return None
    if any(name not in env for name in os.environ):
        # The child's environment leaves out one of this process's variables (the
        # default allocator policy drops MALLOC_MMAP_THRESHOLD_, which glibc reads at
        # start-up): a warm parent, started from this environment, would keep it.
        return None
    key = json.dumps(env, sort_keys=True)
    parent = _warm.get(key)
    if parent is not None and not parent.alive:
        parent.close()
        _warm[key] = parent = None       # it died (killed?): the rest start cold
    if key not in _warm:
        frameworks = ("jax", "keras") if keras_backend() == "jax" else ("keras", "tensorflow")
        # tied: a child nobody watches against the budget any more (this process died)
        # dies too, as the warm parent does
        parent = WarmParent(sys.executable, (), (*frameworks, _CHILD), env, tied=True)
        with open(os.devnull, "w") as null:      # its import lines: nobody's to read
            parent.stdout = parent.stderr = null
            try:
                parent.open(timeout=DEFAULT_TIMEOUT)
            except WarmStartError:
                parent = None
            except BaseException:                # Ctrl-C while it imports: leave none
                parent.close()
                raise
        _warm[key] = parent
    return parent


def _start(request: dict, env: dict, out: Path, err: Path) -> subprocess.Popen | WarmChild:
    """The child, forked from the warm parent where there is one, else a new interpreter."""
    parent = _warm_parent(request, env)
    if parent is not None:
        try:
            return parent.start(env, ["-m", json.dumps(request)], module=_CHILD,
                                output=(str(out), str(err)), who="memfit")
        except WarmStartError:
            parent.close()
            assert _warm is not None
            _warm[json.dumps(env, sort_keys=True)] = None
    with open(out, "w") as o, open(err, "w") as e:
        # Files, not pipes: a chatty child can never block on a full pipe.
        # A new interpreter dies with this process (memfit.lifeline), as a fork does
        # with its tied warm parent.
        request = {**request, "parent": os.getpid()}
        return subprocess.Popen([sys.executable, "-m", _CHILD, json.dumps(request)],
                                stdout=o, stderr=e, env=env)


def run_child(request: dict, *, budget: int | None = None, timeout: float = DEFAULT_TIMEOUT,
              interval: float = 0.02) -> ChildResult:
    """Runs one measuring child and returns what it reported; never raises for its death.

    Args:
        request: the child's request (see :mod:`memfit.estimate.child`).
        budget: kill the child when the anonymous RSS of its process tree passes this
            many bytes (``None``: no limit).
        timeout: seconds before the child is killed as ``"timeout"``.
        interval: seconds between two samples of the child's memory.
    """
    started = time.time()
    env = _child_env(request.get("device", "cpu"), request.get("allocator", "default"))
    with tempfile.TemporaryDirectory(prefix="memfit-child-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        out.touch()
        err.touch()
        proc = _start(request, env, out, err)
        try:
            killed, peak = _watch(proc, budget=budget, timeout=timeout, started=started,
                                  interval=interval)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if isinstance(proc, WarmChild) and proc.returncode == START_COLD:
            _warm_off(env)               # it set a variable read at import: start it anew
            why = cold_reason(err.read_text(errors="replace")) or "it asked to (exit 76)"
            return dataclasses.replace(run_child(request, budget=budget, timeout=timeout,
                                                 interval=interval), cold_reason=why)
        reports = read_reports(out.read_text(errors="replace"))
        stderr = err.read_text(errors="replace")
    r = _result(reports, killed=killed, peak=peak, returncode=proc.returncode, stderr=stderr,
                seconds=time.time() - started)
    return dataclasses.replace(r, started="warm" if isinstance(proc, WarmChild) else "cold")


def _warm_off(env: dict) -> None:
    """Every later child of ``env`` starts as a new interpreter."""
    if _warm is not None:
        parent = _warm.get(key := json.dumps(env, sort_keys=True))
        if parent is not None:
            parent.close()
        _warm[key] = None


def _watch(proc: subprocess.Popen | WarmChild, *, budget: int | None, timeout: float,
           started: float, interval: float) -> tuple[str | None, int | None]:
    """Samples the child's process tree every ``interval`` seconds until it ends, or until
    it passes ``budget`` (``"over-budget"``) or runs past ``timeout`` (``"timeout"``):
    returns why it must be killed (``None``: it ended) and the peak anonymous RSS seen."""
    sampler = TreeSampler(proc.pid)
    killed = None
    for _ in ticks(proc, interval):
        s = sampler.take()
        if s is not None and budget is not None and s.anon_or_total > budget:
            killed = "over-budget"
            break
        if time.time() - started > timeout:
            killed = "timeout"
            break
    return killed, sampler.peak.anon_or_total if sampler.peak is not None else None


def _result(reports: dict[str, dict], *, killed: str | None, peak: int | None,
            returncode: int, stderr: str, seconds: float) -> ChildResult:
    """The child's :class:`ChildResult` from its reports, or from how it ended."""
    baseline = reports.get(Report.BASELINE, {}).get("baseline_anon")
    if killed is not None:
        return ChildResult(killed, peak=peak, baseline=baseline, seconds=seconds,
                           message=f"killed: {killed}")
    if Report.ERROR in reports:
        error = reports[Report.ERROR]
        return ChildResult("oom" if error.get("kind") == "oom" else "error", peak=peak,
                           baseline=baseline, message=error.get("message", ""),
                           seconds=seconds)
    if Report.RESULT not in reports:
        why = (f"killed by signal {-returncode} (out of memory?)" if returncode < 0
               else f"exit code {returncode}")
        # The last lines the child wrote, without TensorFlow's start-up lines: they would
        # crowd out the error of a child that died early.
        tail = "\n".join(strip_noise(stderr).strip().splitlines()[-5:])
        return ChildResult("oom" if returncode == -9 else "crashed", peak=peak,
                           baseline=baseline, message=f"{why}\n{tail}".strip(),
                           seconds=seconds)
    result = reports[Report.RESULT]
    return ChildResult("ok", measured=result.get("measured"),
                       peak=result.get("peak_anon", peak),
                       baseline=result.get("baseline_anon", baseline), report=result,
                       seconds=seconds)


def measure_training(model: str | ModelSpec, batch_size: int, *,
                     dtype_policy: str | None = None, optimizer: str | None = None,
                     input_shape: Any = None, steps: int = DEFAULT_STEPS,
                     device: str = "cpu", budget: int | None = None,
                     timeout: float = DEFAULT_TIMEOUT,
                     allocator: str = "default",
                     device_limit: int | None = None) -> ChildResult:
    """Runs ``steps`` real training steps in a child process and measures their peak.

    Example:
        >>> r = measure_training("mymodels:make_mlp", 64)                 # doctest: +SKIP
        >>> r.measured > 0                                                # doctest: +SKIP
        True

    Args:
        model: a ``.keras`` path or ``module:function`` (a live model cannot be sent to
            another process: save it first), or a :class:`ModelSpec`.
        batch_size: samples per step.
        dtype_policy: Keras dtype policy, e.g. ``"mixed_float16"``.
        optimizer: an optimizer name (see :mod:`memfit.estimate.optimizers`).
        input_shape: input shapes for a model that does not know them.
        steps: training steps to run; the peak is the peak over all of them.
        device: ``"cpu"`` or ``"gpu:0"``.
        budget: kill the child when its anonymous RSS passes this many bytes.
        timeout: seconds before the child is killed.
        allocator: the child's allocator policy (:mod:`memfit.memory.allocator`):
            ``"default"`` (glibc as it comes, like the training process it stands for)
            or ``"fixed"`` (glibc's mmap threshold fixed at 128 KiB: for a training
            process that fixes it too).
        device_limit: on a GPU under Keras's JAX backend, the device bytes the child's
            allocator may hand out (``XLA_PYTHON_CLIENT_MEM_FRACTION``): a step that
            needs more ends as ``"oom"``, a real device out-of-memory.

    Raises:
        MemfitError: if ``model`` is a live model object.
    """
    backend = require_for_training("measuring a training")   # in its child
    check_batch_size(batch_size)
    check_batch_size(steps, "steps")         # 0 steps measured nothing, and said "fits"
    check_policy(dtype_policy)
    check_allocator(allocator)
    if not isinstance(model, str | ModelSpec):
        raise MemfitError("A measuring child needs the model as a .keras file or "
                          "module:function: save it with model.save('model.keras') first.")
    spec = model if isinstance(model, ModelSpec) else ModelSpec(model,
                                                                parse_input_shape(input_shape))
    request = {"mode": "train", "model": spec.to_json(), "batch_size": batch_size,
               "dtype_policy": dtype_policy,
               "optimizer": optimizer if isinstance(optimizer, str) else None,
               "steps": steps, "device": device, "allocator": allocator}
    if backend == "jax" and device.startswith("gpu") and device_limit is not None:
        # JAX holds itself to the limit on the device and fails with XLA's
        # RESOURCE_EXHAUSTED (an "oom") where the step does not fit.
        request["device_limit"] = int(device_limit)
    return run_child(request, budget=budget, timeout=timeout)

"""The doctor's rules about memory over time: kept after ``del``, growth, warm-up.

===================  ========================================================================
kind                 applies when
===================  ========================================================================
allocator-retention  after ``del`` + ``gc.collect()`` between ``fit`` calls, a
                     ``malloc_trim(0)`` gave back at least ``KEPT_MIN`` (the seed story: data
                     built in Python lists every epoch); it takes in data-in-ram's fix
memory-growth        the classifier's verdict on the run's memory is a leak, or allocator
                     retention of at least ``RETENTION_MIN`` (not when allocator-retention
                     applies: the same memory), or a warm-up of ``WARMUP_MIN``
===================  ========================================================================

Example:
    >>> memory_growth(Facts(command=("python", "train.py"), probe=None)) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.doctor.data_rules import DATA_MIN, data_in_ram
from memfit.doctor.facts import Facts, Finding, arg_size, array_names, describe_array
from memfit.memory.classifier import KEPT_MIN
from memfit.sizes import format_size

__all__ = ["kept_after_del", "memory_growth", "KEPT_MIN", "WARMUP_MIN", "WARMUP_SHARE",
           "RETENTION_MIN", "RETENTION_SHARE", "MAX_RSS_SHARE"]

MiB = 2**20
WARMUP_MIN = 256 * MiB          # warm-up growth worth a finding (it is not a bug)
WARMUP_SHARE = 0.25
RETENTION_MIN = 64 * MiB        # allocator retention worth a finding (it is given back)
RETENTION_SHARE = 0.10
MAX_RSS_SHARE = 0.8             # `memfit run --max-rss` suggested at this share of RAM


# -- memory kept after del + gc.collect() -------------------------------------------------

def _kept_measured(f: Facts, kept: Mapping[str, Any]) -> str:
    """What stayed after del + gc.collect(), what a trim gave back, and what built it."""
    releases = f.measurements.releases
    released, stayed, before = int(kept["released"]), int(kept["kept"]), int(kept["before"])
    measured = (f"after del + gc.collect() between fit() calls, anonymous RSS stayed at "
                f"{format_size(stayed)} ({format_size(before)} at the end of the fit() call "
                f"before); a malloc_trim(0) right after gave back {format_size(released)} of "
                f"it, down to {format_size(stayed - released)}")
    if len(releases) > 1:
        measured += f" (the largest of {len(releases)} collections seen, one per epoch)"
    if f.containers:
        measured += (". The script builds its data in Python: "
                     + "; ".join(describe_array(a) for a in f.containers[:2]))
        if f.given:
            names = ", ".join(dict.fromkeys(array_names(a, i)[1]
                                            for i, a in enumerate(f.given)))
            measured += (f", stacked into {names} "
                         f"({format_size(sum(a['nbytes'] for a in f.given))}) for fit()")
    return measured + "."


def kept_after_del(f: Facts) -> Finding | None:
    """The seed story: memory kept after ``del`` + ``gc.collect()`` that a trim gives back."""
    k = f.measurements.kept
    if not k or "error" in k or (k.get("released") or 0) < KEPT_MIN:
        return None
    data = data_in_ram(f)
    stream = data.fix if data else (
        'train = memfit.dataset("data/train", batch_size)   # after: memfit pack '
        "x=data/x.npy y=data/y.npy -o data/train",)
    fix = ("1. stream the data: nothing is built in RAM, so nothing is kept",
           *(f"   {line}" for line in stream),
           "2. or give the freed memory back to the OS:",
           "   gc.collect(); memfit.malloc_trim()      # one line, after each del",
           '   model.fit(..., callbacks=[memfit.MemoryMonitor("runs/exp", trim="epoch")])'
           "   # trims at every epoch end and after a gc.collect() between fit() calls",
           "3. last resort, one process per epoch:",
           f"   memfit run --restart-every 1 -- {f.cmd}   # resumed exactly from the last "
           "checkpoint (with memfit.session() in the script, docs/supervise.md)")
    released = int(k["released"])
    return Finding(
        "allocator-retention",
        "Memory stays after del + gc.collect(): the allocator keeps what was freed "
        "(not a leak)", released + (data.bytes if data else 0), _kept_measured(f, k),
        "del + gc.collect() did free the data, but glibc keeps freed small chunks (the "
        "many small arrays of a list of tuples) in its arenas for reuse instead of "
        "returning them to the OS: this is the allocator keeping freed memory, not a "
        "Python leak. RSS stays high after every del, and with fragmentation a training "
        "that builds its data again every epoch creeps up until it runs out of memory. "
        "Streaming avoids building the data at all; a trim returns what was freed.",
        fix, {"released": released, "kept": int(k["kept"]), "before": int(k["before"]),
              "releases": list(f.measurements.releases), "containers": f.containers,
              "data": None if data is None else dict(data.details)})


# -- memory growth -------------------------------------------------------------------------

def _growth_verdict(f: Facts) -> Mapping[str, Any] | None:
    """The verdict on the run's memory, when it is worth a finding.

    With the probe, its per-step verdict (a trim probe included); without one, what was
    seen from outside. A probe with too few steps to judge gives no verdict: the outside
    view would count the start-up (imports, data loading) as growth.
    """
    v = f.measurements.verdict if f.probe is not None else f.watch_verdict
    if not v or "verdict" not in v:
        return None
    kind, growth, peak = v["verdict"], int(v.get("growth", 0)), f.peak
    if kind == "allocator-retention" and kept_after_del(f) is not None:
        return None                     # the same memory, measured after del: one finding
    if kind == "warm-up":
        worth = growth >= WARMUP_MIN and growth >= WARMUP_SHARE * peak
    elif kind == "allocator-retention":
        worth = growth >= RETENTION_MIN and growth >= RETENTION_SHARE * peak
    else:
        worth = kind == "leak"
    return v if worth else None


def _planned_steps(f: Facts) -> int | None:
    """The steps the one ``fit`` call was asked for, or ``None`` (several calls, unknown)."""
    fit = f.fit
    if not fit.get("steps_per_epoch") or f.measurements.fits > 1:
        return None
    return int(fit["steps_per_epoch"]) * max(1, int(fit.get("epochs", 1))
                                             - int(fit.get("initial_epoch", 0)))


def _growth_measured(f: Facts, v: Mapping[str, Any], planned: int | None) -> tuple[str, int]:
    """The growth in words, and the memory at stake: the growth seen, or for a leak what
    it adds over the steps ``fit`` was asked for."""
    growth, per_step = int(v.get("growth", 0)), v.get("per_step")
    basis = v.get("basis", "time slices")
    unit = {"steps": f"slices of {v.get('steps_per_value', 0):.0f} steps",
            "epochs": "epoch ends"}.get(basis, "time slices, seen from outside")
    steps = f"; {f.measurements.steps} training steps" if f.probe is not None else ""
    measured = (f"anonymous RSS grew {format_size(growth, signed=True)} after the warm-up, "
                f"{format_size(v.get('slope', 0), signed=True)} per value over {v['epochs']} "
                f"values ({unit}{steps})")
    if per_step:
        measured += f", {format_size(per_step, signed=True)} a step"
    if v.get("held") is not None and v["verdict"] == "allocator-retention":
        measured += (f"; glibc's free bytes (mallinfo2) grew "
                     f"{format_size(v['held'], signed=True)} over the same values")
    if v.get("released") is not None:
        measured += f"; a malloc_trim(0) probe gave back {format_size(v['released'])}"
    if v["verdict"] != "leak" or not per_step or not planned:
        return measured, growth
    at_stake = int(per_step * planned)
    return (measured + f". At this rate the {planned:,} steps fit() was asked for "
            f"({f.fit.get('epochs', 1)} epochs × {f.fit['steps_per_epoch']:,}) would add "
            f"{format_size(at_stake)}"), at_stake


def _leak_hints(f: Facts, kind: str) -> list[str]:
    """What the probe saw that usually causes a leak: models alive, retraced functions,
    arrays alive outside fit()'s arguments."""
    causes = f.measurements.causes or {}
    hints = []
    if (causes.get("models_alive") or 0) > 2:
        hints.append(f"{causes['models_alive']} Keras models are alive: models built in a "
                     f"loop stay in Keras's global state; call keras.backend.clear_session() "
                     f"before building the next one, and drop references to old ones")
    for r in causes.get("retraced", [])[:2]:
        hints.append(f"tf.function {r['name']!r} was traced {r['traces']} times: it is called "
                     f"with new Python numbers or shapes; pass tensors (tf.constant(x)), or "
                     f"fix its input_signature=[tf.TensorSpec(...)] or reduce_retracing=True")
    given = {tuple(a["shape"]) for a in f.fit.get("arrays", [])}
    suspects = [a for a in f.alive if tuple(a["shape"]) not in given]
    if kind == "leak" and sum(a["nbytes"] for a in suspects) >= DATA_MIN // 4:
        hints.append(f"{format_size(sum(a['nbytes'] for a in suspects))} of NumPy arrays "
                     f"stay alive outside fit()'s arguments ("
                     + ", ".join(describe_array(a) for a in suspects[:3])
                     + "): a list that keeps arrays grows every epoch")
    return hints


def _growth_advice(f: Facts, kind: str, hints: list[str]) -> tuple[str, str, tuple[str, ...]]:
    """``(title, why, fix)`` for a leak, allocator retention or a large warm-up."""
    max_rss = arg_size(MAX_RSS_SHARE * f.ram_total) if f.ram_total else "8GiB"
    if kind == "leak":
        return ("Memory grows step after step (leak)",
                "Something keeps references as training goes on, so the process runs out of "
                "memory after enough steps, whatever the batch size. Usual causes: "
                "predict()/fit() called in a loop, models built in a loop without "
                "clear_session(), a tf.function retracing on Python scalars, a dataset "
                "rebuilt every epoch, a list that keeps batches or predictions.",
                (*hints,
                 "keras.backend.clear_session()     # between models built in a loop",
                 *(("@tf.function(reduce_retracing=True), and tensors instead of Python "
                    "numbers as arguments",) if f.fit.get("backend") in (None, "tensorflow")
                   else ()),                    # not on JAX, where a stranger was told it
                 f"memfit run --max-rss {max_rss} -- {f.cmd}   # meanwhile: restart from the "
                 f"last checkpoint before memory runs out (with memfit.session() in the script, "
                 f"docs/supervise.md)",
                 'memfit.MemoryMonitor("runs/exp", on_leak="stop")   # or stop cleanly at a '
                 "leak"))
    if kind == "allocator-retention":
        return ("Freed memory stays with the allocator (retention, not a leak)",
                "The memory had been freed, and glibc keeps it in its arenas for reuse: RSS "
                "looks like a leak in top, but the bytes in use do not grow. Often it is "
                "glibc's moving mmap threshold: after the first steps, step buffers come from "
                "its arenas and stay there when freed. Restarting Python is not needed.",
                ('model.fit(..., callbacks=[memfit.MemoryMonitor("runs/exp", trim="epoch")])'
                 "   # malloc_trim(0) at every epoch end",
                 f"MALLOC_TRIM_THRESHOLD_=134217728 MALLOC_ARENA_MAX=2 {f.cmd}   # or cap "
                 "glibc's arenas and trim threshold",
                 f"memfit run --max-rss {max_rss} -- {f.cmd}   # a restart returns it too"))
    fix: tuple[str, ...] = ("count the warm-up level in the budget: "
                            f"memfit run --max-rss {max_rss} -- {f.cmd}",)
    if f.fit.get("pipeline"):         # only a script that streams has buffers to lower
        fix += ('memfit.dataset(..., memory_budget="128MiB")   # if the pipeline\'s '
                "buffers are the part that fills",)
    return ("A large warm-up: memory grew early in the run, then levelled",
            "Caches, tf.function traces, allocator pools and pipeline buffers fill once; "
            "this is not a leak, but it is part of what the run needs.", fix)


def memory_growth(f: Facts) -> Finding | None:
    """Memory that grows over the run: a leak, allocator retention, a large warm-up."""
    v = _growth_verdict(f)
    if v is None:
        return None
    kind, planned = v["verdict"], _planned_steps(f)
    measured, at_stake = _growth_measured(f, v, planned)
    hints = _leak_hints(f, kind)
    if hints:
        measured += ". " + "; ".join(hints)
    title, why, fix = _growth_advice(f, kind, hints)
    return Finding("memory-growth", title, at_stake, measured + ".", why, fix,
                   {"verdict": kind, "basis": v.get("basis", "time slices"),
                    "growth": int(v.get("growth", 0)), "slope": v.get("slope"),
                    "per_step": v.get("per_step"), "planned_steps": planned,
                    "released": v.get("released"),
                    "causes": f.measurements.causes or {}})

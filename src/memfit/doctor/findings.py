"""The rules of ``memfit doctor``: from what one run measured to what to change.

Each rule reads :class:`Facts` (the probe's results from inside the training process,
and the process tree's memory seen from outside) and returns a :class:`Finding` or
``None`` when it does not apply. A finding carries the numbers measured in this run, why
they matter, the exact memfit command or code change that fixes it, and ``bytes``: the
memory at stake (about what the fix saves), by which :func:`diagnose` ranks findings.

=================  ==========================================================================
kind               applies when
=================  ==========================================================================
data-in-ram        NumPy arrays given to ``fit`` (and Keras's copy of them), other arrays alive,
                   ``from_tensor_slices`` tensors or an in-memory ``cache()`` hold at least
                   ``DATA_MIN`` and ``DATA_SHARE`` of the peak
activations        the memory the estimator says grows with the batch (activations, their
                   gradients, kernel buffers) at the run's batch size is at least
                   ``ACTIVATIONS_MIN`` and ``ACTIVATIONS_SHARE`` of the model's training memory
allocator-retention  after ``del`` + ``gc.collect()`` between ``fit`` calls, a
                   ``malloc_trim(0)`` gave back at least ``KEPT_MIN`` (the seed story: data
                   built in Python lists every epoch); it takes in data-in-ram's fix and
                   replaces that finding and a non-leak memory-growth one
memory-growth      the classifier's verdict on the run's memory is a leak, or allocator
                   retention of at least ``RETENTION_MIN`` (or a warm-up of ``WARMUP_MIN``)
gpu-no-limit       a GPU without memory growth or a cap, shared with other processes
pipeline-buffers   a ``shuffle``/``prefetch`` buffer of at least ``BUFFER_MIN``
=================  ==========================================================================

Example:
    >>> facts = Facts(command=("python", "train.py"), probe=None)
    >>> diagnose(facts)
    []
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memfit.memory.classify import KEPT_MIN
from memfit.sizes import format_size

__all__ = ["Finding", "Facts", "RULES", "diagnose", "DATA_MIN", "DATA_SHARE",
           "ACTIVATIONS_MIN", "ACTIVATIONS_SHARE", "WARMUP_MIN", "RETENTION_MIN", "BUFFER_MIN",
           "SHUFFLE_TARGET", "KEPT_MIN"]

MiB = 2**20
DATA_MIN = 64 * MiB             # data held in RAM below this is not worth streaming
DATA_SHARE = 0.10               # ... nor below this share of the peak
ACTIVATIONS_MIN = 32 * MiB
ACTIVATIONS_SHARE = 0.40        # of the estimate's model memory
WARMUP_MIN = 256 * MiB          # warm-up growth worth a finding (it is not a bug)
WARMUP_SHARE = 0.25
RETENTION_MIN = 64 * MiB        # allocator retention worth a finding (it is given back)
RETENTION_SHARE = 0.10
BUFFER_MIN = 64 * MiB           # a shuffle/prefetch buffer worth a finding
SHUFFLE_TARGET = 16 * MiB       # what a shuffle buffer needs, in bytes, to mix well
MAX_RSS_SHARE = 0.8             # `memfit run --max-rss` suggested at this share of RAM


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing to change, with the numbers that show it.

    Attributes:
        kind: ``data-in-ram``, ``activations``, ``memory-growth``, ``gpu-no-limit`` or
            ``pipeline-buffers``.
        title: one line.
        bytes: memory at stake: about what the fix saves (what ranks findings).
        measured: what this run measured, in words with the numbers.
        why: why it matters.
        fix: the commands or code lines that fix it, one per item.
        details: the numbers, for tools.
    """

    kind: str
    title: str
    bytes: int
    measured: str
    why: str
    fix: tuple[str, ...]
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "title": self.title, "bytes": self.bytes,
                "measured": self.measured, "why": self.why, "fix": list(self.fix),
                "details": dict(self.details)}


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one doctor run measured.

    Attributes:
        command: the command run.
        probe: the in-process probe's results (:func:`memfit.doctor.probe.finish`), or
            ``None`` when the command has no Python process that imported Keras.
        peak_anon: peak anonymous RSS of the whole process tree (from outside).
        watch_verdict: the verdict from outside (:class:`memfit.memory.Verdict` record).
        ram_total: the machine's memory, in bytes.
    """

    command: Sequence[str]
    probe: Mapping[str, Any] | None
    peak_anon: int | None = None
    watch_verdict: Mapping[str, Any] | None = None
    ram_total: int | None = None

    @property
    def peak(self) -> int:
        """The largest anonymous RSS seen, from inside or outside (0 if none)."""
        inside = (self.probe or {}).get("rss_peak_steps") or 0
        return max(inside, self.peak_anon or 0)

    @property
    def fit(self) -> Mapping[str, Any]:
        return (self.probe or {}).get("fit") or {}

    @property
    def cmd(self) -> str:
        return shlex.join(self.command)


def _size(n: float | int | None) -> str:
    return format_size(n)


def _arg_size(n: float) -> str:
    """A size as a command-line argument: ``19.5GiB``, rounded down to 0.5 GiB / 1 MiB."""
    if n >= 2**30:
        return f"{max(0.5, math.floor(n / 2**29) / 2):g}GiB"
    return f"{max(1, int(n // MiB))}MiB"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "n/a"


# -- data held in RAM --------------------------------------------------------------------

def _names(array: Mapping[str, Any], i: int) -> tuple[str, str]:
    """``(feature, variable)`` for an array of fit's arguments: ``("x", "x_train")``."""
    names = list(array.get("names", ()))
    arg = names[0] if names else f"a{i}"
    feature = arg if arg.isidentifier() else f"f{i}"
    variables = [n for n in names[1:] if n.isidentifier()]
    return feature, variables[0] if variables else (arg if arg.isidentifier() else f"array{i}")


def _tuple(items: Sequence[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _alive(a: Mapping[str, Any]) -> str:
    """``x_train: float32 (6000, 48, 64) 70.3 MiB`` or, for a container of small arrays,
    ``samples: a list of 6,000 tuples of float32/int32 arrays, 70.4 MiB``."""
    name = (a.get("names") or ["unnamed"])[0]
    if a.get("container"):
        return (f"{name}: a {a['container']} of {a['dtype']} arrays ({a['shape'][0]:,} "
                f"arrays, {_size(a['nbytes'])})")
    return f"{name}: {a['dtype']} {tuple(a['shape'])} {_size(a['nbytes'])}"


def data_in_ram(f: Facts) -> Finding | None:
    """The data set (or other large arrays) held in the process's memory."""
    if not f.probe:
        return None
    p = f.probe
    fit = f.fit
    alive = [a for a in (p.get("arrays") or {}).get("largest", []) if not a["mapped"]]
    alive_total = (p.get("arrays") or {}).get("total", 0)
    given = [a for a in fit.get("arrays", []) if not a["mapped"]]
    given_bytes = sum(a["nbytes"] for a in given)
    pipeline = fit.get("pipeline") or {}
    tensors = int(pipeline.get("tensors_bytes", 0))
    caches = [b for b in pipeline.get("buffers", []) if b["kind"] == "cache" and b["bytes"]]
    cache_bytes = sum(b["bytes"] for b in caches)
    before, first = p.get("rss_before_fit"), p.get("rss_first_step")
    growth_at_start = max(0, first - before) if before is not None and first is not None else 0
    copy = min(growth_at_start, given_bytes) if given_bytes else 0
    others = max(0, alive_total - given_bytes)
    held = given_bytes + copy + tensors + cache_bytes + others
    peak = f.peak
    if held < DATA_MIN or (peak and held < DATA_SHARE * peak):
        return None
    budget = min(256 * MiB, max(64 * MiB, 2 ** int(math.log2(max(held // 8, 1)))))
    saves = max(0, held - budget)
    parts = []
    if given:
        args = ", ".join(f"{a['names'][0] if a['names'] else '?'}={a['dtype']} "
                         f"{tuple(a['shape'])} {_size(a['nbytes'])}" for a in given[:4])
        parts.append(f"fit() was given {_size(given_bytes)} of NumPy arrays ({args})")
        if copy:
            parts.append(f"anonymous RSS grew {_size(growth_at_start)} from the call of fit() "
                         f"to its first step: Keras copies in-memory arrays into tensors, so "
                         f"the data is held twice")
    if tensors:
        parts.append(f"the tf.data pipeline holds {_size(tensors)} of tensors in memory "
                     f"(from_tensor_slices/from_tensors: {', '.join(pipeline['tensors'][:3])})")
    if cache_bytes:
        parts.append(f"cache() without a file name keeps {_size(cache_bytes)} "
                     f"({caches[0]['elements']} elements) in memory after the first epoch")
    if others >= DATA_MIN // 4:
        listed = ", ".join(_alive(a) for a in alive[:3])
        parts.append(f"{_size(others)} of other NumPy arrays stay alive during training "
                     f"({listed})")
    measured = ("; ".join(parts) + f". Together about {_size(held)} of the "
                f"{_size(peak)} peak anonymous RSS ({_share(held, peak)}).")
    batch = fit.get("batch_size") or 32
    names = [_names(a, i) for i, a in enumerate(given[:4] or
                                                [a for a in alive if not a.get("container")][:2]
                                                or alive[:2])]
    features = _tuple([f'"{k}"' for k, _ in names])
    sources = ", ".join(f'"{k}": "data/{k}.npy"' for k, _ in names)
    saves_text = "; ".join(f'np.save("data/{k}.npy", {v})' for k, v in names)
    pack_args = " ".join(f"{k}=data/{k}.npy" for k, _ in names)
    fix = (f"{saves_text}      # once: the arrays to .npy files",
           f"train = memfit.dataset({{{sources}}}, {batch}, features={features}, "
           f'memory_budget="{_arg_size(budget)}")   # memory-mapped, read batch by batch',
           "model.fit(train, ...)      # instead of fit(arrays) / from_tensor_slices(arrays)",
           f"or packed into checksummed TFRecord shards: memfit pack {pack_args} -o "
           f'data/train, then memfit.dataset("data/train", {batch}, features={features})')
    if cache_bytes and not (given or tensors):
        fix = ('ds.cache("cache/train")    # cache to a file instead of memory, or drop '
               "cache()",) + fix[1:]
    stream = (f"Streamed from .npy files or packed shards, memory is the pipeline's budget "
              f"({_arg_size(budget)} here), whatever the size of the data: about "
              f"{_size(saves)} less.")
    if given or tensors or cache_bytes:
        title = "The training data is held in RAM"
        why = ("model.fit(x=array) and from_tensor_slices(array) need the whole data set in "
               "memory (a smaller batch_size does not change that), and Keras copies "
               "in-memory arrays once more into tensors. " + stream)
    else:
        title = "Large NumPy arrays are held in RAM"
        why = ("Arrays alive while training takes memory that the training cannot use. If "
               "they are the data, stream it; if they are left over (raw data after the "
               "pipeline was built), del them before fit(). " + stream)
    return Finding(
        "data-in-ram", title, saves, measured, why,
        fix, {"held": held, "fit_arrays": given_bytes, "keras_copy": copy,
              "tensors": tensors, "cache": cache_bytes, "other_arrays": others,
              "budget": budget, "peak": peak})


# -- memory kept after del + gc.collect() -------------------------------------------------

def kept_after_del(f: Facts) -> Finding | None:
    """The seed story: memory kept after ``del`` + ``gc.collect()`` that a trim gives back."""
    k = (f.probe or {}).get("kept")
    if not k or "error" in k or (k.get("released") or 0) < KEPT_MIN:
        return None
    releases = (f.probe or {}).get("releases") or []
    released, stayed, before = int(k["released"]), int(k["kept"]), int(k["before"])
    measured = (f"after del + gc.collect() between fit() calls, anonymous RSS stayed at "
                f"{_size(stayed)} ({_size(before)} at the end of the fit() call before); a "
                f"malloc_trim(0) right after gave back {_size(released)} of it, down to "
                f"{_size(stayed - released)}")
    if len(releases) > 1:
        measured += f" (the largest of {len(releases)} collections seen, one per epoch)"
    containers = [a for a in ((f.probe or {}).get("arrays") or {}).get("largest", [])
                  if a.get("container")]
    given = [a for a in f.fit.get("arrays", []) if not a["mapped"]]
    if containers:
        measured += (". The script builds its data in Python: "
                     + "; ".join(_alive(a) for a in containers[:2]))
        if given:
            names = ", ".join(dict.fromkeys(_names(a, i)[1] for i, a in enumerate(given)))
            measured += (f", stacked into {names} "
                         f"({_size(sum(a['nbytes'] for a in given))}) for fit()")
    measured += "."
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
           "checkpoint (the script uses memfit.session(), docs/supervise.md)")
    at_stake = released + (data.bytes if data else 0)
    return Finding(
        "allocator-retention",
        "Memory stays after del + gc.collect(): the allocator keeps what was freed "
        "(not a leak)", at_stake, measured,
        "del + gc.collect() did free the data, but glibc keeps freed small chunks (the "
        "many small arrays of a list of tuples) in its arenas for reuse instead of "
        "returning them to the OS: this is the allocator keeping freed memory, not a "
        "Python leak. RSS stays high after every del, and with fragmentation a training "
        "that builds its data again every epoch creeps up until it runs out of memory. "
        "Streaming avoids building the data at all; a trim returns what was freed.",
        fix, {"released": released, "kept": stayed, "before": before,
              "releases": releases, "containers": containers,
              "data": None if data is None else dict(data.details)})


# -- activations ---------------------------------------------------------------------------

def activations(f: Facts) -> Finding | None:
    """The model's activations dominate its training memory (from the estimator)."""
    e = (f.probe or {}).get("estimate")
    if not e or "error" in e:
        return None
    # What halving the batch halves: activations, their gradients and the kernels' buffers
    # (at the step's peak the backward pass's buffers often outweigh the activations
    # themselves). The share is of what the model uses: the safety margin is not memory.
    act, model = e.get("batch_memory", e["activations"]), e["model_bytes"] - e.get("margin", 0)
    if act < ACTIVATIONS_MIN or act < ACTIVATIONS_SHARE * model:
        return None
    batch = e["batch_size"]
    heavy = [r for r in e.get("layers", [])[:3] if r["share"] >= 0.01]
    layers = ", ".join(f"{r['name']} ({r['type']}, {r['share'] * 100:.0f} %, "
                       f"{_size(r['kept'])})" for r in heavy)
    gpu = (f.probe or {}).get("gpu") or {}
    devices = gpu.get("devices") or []
    if devices:
        device = f"the GPU's {_size(devices[0]['total'])}"
        device_total = devices[0]["total"]
    else:
        device = f"this machine's {_size(f.ram_total)} of RAM"
        device_total = f.ram_total
    peak = (f.probe or {}).get("rss_peak_steps")
    measured = (f"the estimate of one training step at batch {batch} ({e['dtype_policy']}, "
                f"{e['optimizer']}): {_size(model)} for the model, {_size(e['total'])} with "
                f"the framework; memory that grows with the batch (activations kept for "
                f"the backward pass, their gradients, the kernels' buffers) {_size(act)} "
                f"({_share(act, model)}), of which activations alive at the step's peak "
                f"{_size(e['activations'])}; weights {_size(e['weights'])}, "
                f"optimizer slots {_size(e['optimizer_slots'])}, gradients "
                f"{_size(e['gradients'])}. The process peaked at {_size(peak)} of "
                f"anonymous RSS during the steps (measured), against {device}"
                + (f". The layers keeping the most: {layers}." if layers else "."))
    smaller = e.get("smaller", [])
    arrays = bool(f.fit.get("arrays"))
    fix = [(f"model.fit(..., batch_size={s['batch_size']})" if arrays else
            f"ds.batch({s['batch_size']})")
           + f"   # estimate {_size(s['total'])} "
           f"({format_size(s['total'] - e['total'], signed=True)}), activations "
           f"{_size(s['activations'])}" for s in smaller]
    saves = act // 2
    model_file = (f.probe or {}).get("model_file")
    source = shlex.quote(model_file) if model_file else "mymodule:build_model"
    if e["dtype_policy"] == "float32":
        fix.append('keras.mixed_precision.set_global_policy("mixed_float16")   # before '
                   f"building the model: activations in 16 bits, about {_size(act // 2)} less "
                   "(on a CPU without float16 units, mixed_bfloat16)")
    policy = " --dtype-policy mixed_float16" if e["dtype_policy"] == "float32" else ""
    half = max(1, batch // 2)
    fix.append(f"memfit estimate {source} -b {half}{policy}      # check a change before "
               "running it")
    budget = _arg_size(device_total) if device_total else "8GiB"
    fix.append(f"memfit find-batch-size {source} --budget {budget}   # the largest batch that "
               "fits, by real steps in child processes")
    return Finding(
        "activations", f"Activations dominate the model's training memory at batch {batch}",
        saves, measured,
        "Activations, and the gradients and kernel buffers made from them, grow with the "
        "batch size (and with the bytes of the compute dtype); weights and optimizer state "
        "do not. Halving the batch, or computing in 16 bits, halves them: about "
        f"{_size(saves)} here.",
        tuple(fix), {"batch_size": batch, "batch_memory": act,
                     "activations": e["activations"], "model_bytes": model,
                     "total": e["total"], "device_total": device_total,
                     "layers": e.get("layers", []), "smaller": smaller,
                     "model_file": model_file})


# -- memory growth -------------------------------------------------------------------------

def memory_growth(f: Facts) -> Finding | None:
    """Memory that grows over the run: a leak, allocator retention, a large warm-up."""
    # With the probe, its per-step verdict (a trim probe included); without one, what
    # was seen from outside. A probe with too few steps to judge gives no verdict: the
    # outside view would count the start-up (imports, data loading) as growth.
    inside = f.probe is not None
    v = (f.probe or {}).get("verdict") if inside else f.watch_verdict
    if not v or "verdict" not in v:
        return None
    kind = v["verdict"]
    growth = int(v.get("growth", 0))
    peak = f.peak
    if kind == "warm-up":
        if growth < WARMUP_MIN or growth < WARMUP_SHARE * peak:
            return None
    elif kind == "allocator-retention":
        if growth < RETENTION_MIN or growth < RETENTION_SHARE * peak:
            return None
    elif kind != "leak":
        return None
    basis = v.get("basis", "time slices")
    fit = f.fit
    planned = None
    if fit.get("steps_per_epoch") and (f.probe or {}).get("fits", 1) <= 1:
        planned = int(fit["steps_per_epoch"]) * max(1, int(fit.get("epochs", 1))
                                                    - int(fit.get("initial_epoch", 0)))
    per_step = v.get("per_step")
    steps = (f.probe or {}).get("steps", 0)
    unit = {"steps": f"slices of {v.get('steps_per_value', 0):.0f} steps",
            "epochs": "epoch ends"}.get(basis, "time slices, seen from outside")
    measured = (f"anonymous RSS grew {format_size(growth, signed=True)} after the warm-up, "
                f"{format_size(v.get('slope', 0), signed=True)} per value over {v['epochs']} "
                f"values ({unit}" + (f"; {steps} training steps" if inside else "") + ")")
    if per_step:
        measured += f", {format_size(per_step, signed=True)} a step"
    if v.get("released") is not None:
        measured += f"; a malloc_trim(0) probe gave back {_size(v['released'])}"
    at_stake = growth
    if kind == "leak" and per_step and planned:
        at_stake = int(per_step * planned)
        measured += (f". At this rate the {planned:,} steps fit() was asked for "
                     f"({fit.get('epochs', 1)} epochs × {fit['steps_per_epoch']:,}) would add "
                     f"{_size(at_stake)}")
    causes = (f.probe or {}).get("causes") or {}
    hints = []
    if (causes.get("models_alive") or 0) > 2:
        hints.append(f"{causes['models_alive']} Keras models are alive: models built in a "
                     f"loop stay in Keras's global state; call keras.backend.clear_session() "
                     f"before building the next one, and drop references to old ones")
    for r in causes.get("retraced", [])[:2]:
        hints.append(f"tf.function {r['name']!r} was traced {r['traces']} times: it is called "
                     f"with new Python numbers or shapes; pass tensors (tf.constant(x)), or "
                     f"fix its input_signature=[tf.TensorSpec(...)] or reduce_retracing=True")
    alive = [a for a in ((f.probe or {}).get("arrays") or {}).get("largest", [])
             if not a["mapped"]]
    given = {tuple(a["shape"]) for a in fit.get("arrays", [])}
    suspects = [a for a in alive if tuple(a["shape"]) not in given]
    if kind == "leak" and sum(a["nbytes"] for a in suspects) >= DATA_MIN // 4:
        hints.append(f"{_size(sum(a['nbytes'] for a in suspects))} of NumPy arrays stay "
                     f"alive outside fit()'s arguments ("
                     + ", ".join(_alive(a) for a in suspects[:3])
                     + "): a list that keeps arrays grows every epoch")
    if hints:
        measured += ". " + "; ".join(hints)
    measured += "."
    max_rss = _arg_size(MAX_RSS_SHARE * f.ram_total) if f.ram_total else "8GiB"
    if kind == "leak":
        title = "Memory grows step after step (leak)"
        why = ("Something keeps references as training goes on, so the process runs out of "
               "memory after enough steps, whatever the batch size. Usual causes: "
               "predict()/fit() called in a loop, models built in a loop without "
               "clear_session(), a tf.function retracing on Python scalars, a dataset "
               "rebuilt every epoch, a list that keeps batches or predictions.")
        fix = tuple(hints) + (
            "keras.backend.clear_session()     # between models built in a loop",
            "@tf.function(reduce_retracing=True), and tensors instead of Python numbers as "
            "arguments",
            f"memfit run --max-rss {max_rss} -- {f.cmd}   # meanwhile: restart from the last "
            f"checkpoint before memory runs out (the script uses memfit.session(), "
            f"docs/supervise.md)",
            'memfit.MemoryMonitor("runs/exp", on_leak="stop")   # or stop cleanly at a leak')
    elif kind == "allocator-retention":
        title = "Freed memory stays with the allocator (retention, not a leak)"
        why = ("The memory had been freed, and glibc keeps it in its arenas for reuse: RSS "
               "looks like a leak in top, and malloc_trim(0) gives it back. Restarting "
               "Python is not needed.")
        fix = ('model.fit(..., callbacks=[memfit.MemoryMonitor("runs/exp", trim="epoch")])'
               "   # malloc_trim(0) at every epoch end",
               f"MALLOC_TRIM_THRESHOLD_=134217728 MALLOC_ARENA_MAX=2 {f.cmd}   # or cap "
               "glibc's arenas and trim threshold",
               f"memfit run --max-rss {max_rss} -- {f.cmd}   # a restart returns it too")
    else:
        title = "A large warm-up: memory grew early in the run, then levelled"
        why = ("Caches, tf.function traces, allocator pools and pipeline buffers fill once; "
               "this is not a leak, but it is part of what the run needs.")
        fix = ("count the warm-up level in the budget: "
               f"memfit run --max-rss {max_rss} -- {f.cmd}",)
        if fit.get("pipeline"):         # only a script that streams has buffers to lower
            fix += ('memfit.dataset(..., memory_budget="128MiB")   # if the pipeline\'s '
                    "buffers are the part that fills",)
    return Finding("memory-growth", title, at_stake, measured, why, fix,
                   {"verdict": kind, "basis": basis, "growth": growth,
                    "slope": v.get("slope"), "per_step": per_step, "planned_steps": planned,
                    "released": v.get("released"), "causes": causes})


# -- GPU -----------------------------------------------------------------------------------

def gpu_no_limit(f: Facts) -> Finding | None:
    """A GPU without memory growth or a cap, while other processes use the same device."""
    g = (f.probe or {}).get("gpu")
    if not g:
        return None
    unbounded = [d for d in g.get("gpus", []) if not d.get("growth") and not d.get("memory_limit")]
    devices = g.get("devices") or []
    mine = [d for d in devices if d.get("own")] or devices
    shared = [d for d in mine if d.get("others")]
    if not unbounded or not shared:
        return None
    d = shared[0]
    others = sum(o["used"] for o in d["others"])
    allocator = g.get("allocator") or {}
    used_by_tf = max((a.get("peak", 0) for a in allocator.values()), default=0)
    own = d.get("own") or g.get("own") or 0
    saves = max(0, own - used_by_tf) if used_by_tf else own
    pids = ", ".join(str(o["pid"]) for o in d["others"][:5])
    measured = (f"GPU {d['index']} ({d.get('name', '?')}, {_size(d['total'])}): this process "
                f"holds {_size(own)}" + (f" while TensorFlow's allocator peaked at "
                                          f"{_size(used_by_tf)}" if used_by_tf else "")
                + f"; {len(d['others'])} other process{'es' if len(d['others']) != 1 else ''}"
                f" (pid {pids}) hold {_size(others)} on the same device. Neither memory "
                f"growth nor a memory cap is set ({', '.join(u['name'] for u in unbounded)}).")
    return Finding(
        "gpu-no-limit", "The GPU is shared, and this process may take all of it",
        saves, measured,
        "Without memory growth or a cap TensorFlow reserves nearly all of a GPU's free "
        "memory when it starts, so the other processes on the device (or the next one to "
        "start) run out of memory, although this one does not use it.",
        ("memfit.configure_device(growth=True)        # first thing in the script, before "
         "TensorFlow uses the GPU",
         'memfit.configure_device(memory_limit="8GiB")  # or a cap of this process\'s share',
         f"TF_FORCE_GPU_ALLOW_GROWTH=true {f.cmd}   # growth without a code change",
         "memfit share jobs.toml --device gpu:0      # run several trainings on one GPU "
         "within a budget (docs/share.md)"),
        {"device": d, "own": own, "others": others, "allocator_peak": used_by_tf,
         "unbounded": unbounded})


# -- pipeline buffers ----------------------------------------------------------------------

def pipeline_buffers(f: Facts) -> Finding | None:
    """``shuffle``/``prefetch`` buffers far larger than what they are for."""
    pipeline = f.fit.get("pipeline") or {}
    big = [b for b in pipeline.get("buffers", [])
           if b["kind"] in ("shuffle", "prefetch") and (b.get("bytes") or 0) >= BUFFER_MIN]
    if not big:
        return None
    p = f.probe or {}
    before, first = p.get("rss_before_fit"), p.get("rss_first_step")
    parts, fix, saves = [], [], 0
    for b in big:
        each = b["element_bytes"]
        if b["kind"] == "shuffle":
            target = max(1, SHUFFLE_TARGET // each)
            saves += max(0, b["bytes"] - target * each)
            parts.append(f"shuffle(buffer_size={b['buffer_size']:,}) on elements of "
                         f"{b['element']} ({_size(each)} each) holds {b['elements']:,} "
                         f"elements: {_size(b['bytes'])}")
            fix.append(f"ds.shuffle(buffer_size={target:,})   # {_size(target * each)} of "
                       f"elements instead of {_size(b['bytes'])}")
        else:
            saves += max(0, b["bytes"] - 2 * each)
            parts.append(f"prefetch({b['buffer_size']:,}) of elements of {b['element']} "
                         f"({_size(each)} each) holds {_size(b['bytes'])}")
            fix.append("ds.prefetch(tf.data.AUTOTUNE)   # or prefetch(2): a few batches are "
                       "enough to hide the input's latency")
    measured = "; ".join(parts)
    if before is not None and first is not None:
        measured += (f". Anonymous RSS grew {_size(max(0, first - before))} from the call of "
                     f"fit() to its first step (a shuffle buffer fills before the first batch)")
    measured += "."
    if any(b["kind"] == "shuffle" for b in big):
        fix += ["shuffle what is small (indices, file names) before the map that makes the "
                "big elements: tf.data.Dataset.range(n).shuffle(n).map(load)",
                'memfit.dataset(path, batch_size, memory_budget="256MiB")   # a shuffle '
                "window sized in bytes (memfit pack first)"]
    return Finding(
        "pipeline-buffers", "Input pipeline buffers are larger than needed", saves,
        measured,
        "A shuffle buffer is counted in elements, so on big records it costs the buffer size "
        "times the record size; its mixing comes from how many elements it holds, and a "
        f"few {_size(SHUFFLE_TARGET)} of elements already mix well when the input is "
        "itself in shuffled files. Prefetching more than a few batches only holds memory.",
        tuple(fix), {"buffers": big})


RULES: tuple[Callable[[Facts], Finding | None], ...] = (
    kept_after_del, data_in_ram, activations, memory_growth, gpu_no_limit, pipeline_buffers)


def diagnose(facts: Facts) -> list[Finding]:
    """Applies every rule; the findings that apply, the most memory at stake first.

    Memory kept after ``del`` (allocator-retention) tells the whole story of data built
    in RAM and freed each epoch: it replaces data-in-ram (whose fix it carries) and a
    memory-growth finding that is not a leak.
    """
    found = [finding for rule in RULES if (finding := rule(facts)) is not None]
    leak = any(x.kind == "memory-growth" and x.details.get("verdict") == "leak" for x in found)
    data = next((x for x in found if x.kind == "data-in-ram"), None)
    if leak and data is not None and \
            data.details["held"] - data.details["other_arrays"] < DATA_MIN:
        # only arrays outside fit()'s arguments, while memory grows: the leak's suspects
        # (named in its finding), not data to stream
        found.remove(data)
    if any(x.kind == "allocator-retention" for x in found):
        found = [x for x in found if x.kind != "data-in-ram" and not (
            x.kind == "memory-growth" and x.details.get("verdict") != "leak")]
    return sorted(found, key=lambda finding: finding.bytes, reverse=True)

"""The doctor's rules about the model and its device: activations, a shared GPU.

=================  ==========================================================================
kind               applies when
=================  ==========================================================================
activations        the memory the estimator says grows with the batch (activations, their
                   gradients, kernel buffers) at the run's batch size is at least
                   ``ACTIVATIONS_MIN`` and ``ACTIVATIONS_SHARE`` of the model's training memory
gpu-no-limit       a GPU without memory growth or a cap, shared with other processes
=================  ==========================================================================

Example:
    >>> activations(Facts(command=("python", "train.py"), probe=None)) is None
    True
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from memfit.doctor.facts import Facts, Finding, arg_size, percent
from memfit.sizes import format_count, format_size

__all__ = ["activations", "gpu_no_limit", "ACTIVATIONS_MIN", "ACTIVATIONS_SHARE"]

MiB = 2**20
ACTIVATIONS_MIN = 32 * MiB
ACTIVATIONS_SHARE = 0.40        # of the estimate's model memory


# -- activations ---------------------------------------------------------------------------

def _device(f: Facts) -> tuple[str, int | None]:
    """The memory the training runs against, in words and bytes: the GPU's, else RAM."""
    devices = (f.measurements.gpu or {}).get("devices") or []
    if devices:
        return f"the GPU's {format_size(devices[0]['total'])}", devices[0]["total"]
    return f"this machine's {format_size(f.ram_total)} of RAM", f.ram_total


def _activations_measured(f: Facts, e: Mapping[str, Any], act: int, model: int) -> str:
    """The estimate of one step, in words: what grows with the batch, the heavy layers."""
    heavy = [r for r in e.get("layers", [])[:3] if r["share"] >= 0.01]
    layers = ", ".join(f"{r['name']} ({r['type']}, {r['share'] * 100:.0f} %, "
                       f"{format_size(r['kept'])})" for r in heavy)
    peak = f.measurements.rss_peak_steps
    return (f"the estimate of one training step at batch {e['batch_size']} "
            f"({e['dtype_policy']}, {e['optimizer']}): {format_size(model)} for the model, "
            f"{format_size(e['total'])} with the framework; memory that grows with the batch "
            f"(activations kept for the backward pass, their gradients, the kernels' buffers) "
            f"{format_size(act)} ({percent(act, model)}), of which activations alive at the "
            f"step's peak {format_size(e['activations'])}; weights {format_size(e['weights'])}, "
            f"optimizer slots {format_size(e['optimizer_slots'])}, gradients "
            f"{format_size(e['gradients'])}. The process peaked at {format_size(peak)} of "
            f"anonymous RSS during the steps (measured), against {_device(f)[0]}"
            + (f". The layers keeping the most: {layers}." if layers else "."))


def _activations_fix(f: Facts, e: Mapping[str, Any], act: int) -> tuple[str, ...]:
    """Smaller batches with their estimates, 16-bit compute, and the commands to check."""
    arrays = bool(f.fit.get("arrays"))
    fix = [(f"model.fit(..., batch_size={s['batch_size']})" if arrays else
            f"ds.batch({s['batch_size']})")
           + f"   # estimate {format_size(s['total'])} "
           f"({format_size(s['total'] - e['total'], signed=True)}), activations "
           f"{format_size(s['activations'])}" for s in e.get("smaller", [])]
    model_file = f.measurements.model_file
    source = shlex.quote(model_file) if model_file else "mymodule:build_model"
    if e["dtype_policy"] == "float32":
        fix.append('keras.mixed_precision.set_global_policy("mixed_float16")   # before '
                   f"building the model: activations in 16 bits, about "
                   f"{format_size(act // 2)} less (on a CPU without float16 units, "
                   "mixed_bfloat16)")
    policy = " --dtype-policy mixed_float16" if e["dtype_policy"] == "float32" else ""
    half = max(1, e["batch_size"] // 2)
    fix.append(f"memfit estimate {source} -b {half}{policy}      # check a change before "
               "running it")
    device_total = _device(f)[1]
    budget = arg_size(device_total) if device_total else "8GiB"
    fix.append(f"memfit find-batch-size {source} --budget {budget}   # the largest batch that "
               "fits, by real steps in child processes")
    return tuple(fix)


def activations(f: Facts) -> Finding | None:
    """The model's activations dominate its training memory (from the estimator)."""
    e = f.measurements.estimate
    if not e or "error" in e:
        return None
    # What halving the batch halves: activations, their gradients and the kernels' buffers
    # (at the step's peak the backward pass's buffers often outweigh the activations
    # themselves). The share is of what the model uses: the safety margin is not memory.
    act, model = e.get("batch_memory", e["activations"]), e["model_bytes"] - e.get("margin", 0)
    if act < ACTIVATIONS_MIN or act < ACTIVATIONS_SHARE * model:
        return None
    batch, saves = e["batch_size"], act // 2
    return Finding(
        "activations", f"Activations dominate the model's training memory at batch {batch}",
        saves, _activations_measured(f, e, act, model),
        "Activations, and the gradients and kernel buffers made from them, grow with the "
        "batch size (and with the bytes of the compute dtype); weights and optimizer state "
        "do not. Halving the batch, or computing in 16 bits, halves them: about "
        f"{format_size(saves)} here.",
        _activations_fix(f, e, act),
        {"batch_size": batch, "batch_memory": act, "activations": e["activations"],
         "model_bytes": model, "total": e["total"], "device_total": _device(f)[1],
         "layers": e.get("layers", []), "smaller": e.get("smaller", []),
         "model_file": f.measurements.model_file})


# -- GPU -----------------------------------------------------------------------------------

def gpu_no_limit(f: Facts) -> Finding | None:
    """A GPU without memory growth or a cap, while other processes use the same device."""
    g = f.measurements.gpu
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
    measured = (f"GPU {d['index']} ({d.get('name', '?')}, {format_size(d['total'])}): this process "
                f"holds {format_size(own)}" + (f" while TensorFlow's allocator peaked at "
                                          f"{format_size(used_by_tf)}" if used_by_tf else "")
                + f"; {format_count(len(d['others']), 'other process', 'other processes')}"
                f" (pid {pids}) hold {format_size(others)} on the same device. Neither memory "
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

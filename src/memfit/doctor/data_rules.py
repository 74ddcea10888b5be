"""The doctor's rules about the training data: data held in RAM, input pipeline buffers.

=================  ==========================================================================
kind               applies when
=================  ==========================================================================
data-in-ram        NumPy arrays given to ``fit`` (and Keras's copy of them), other arrays alive,
                   ``from_tensor_slices`` tensors or an in-memory ``cache()`` hold at least
                   ``DATA_MIN`` and ``DATA_SHARE`` of the peak
pipeline-buffers   a ``shuffle``/``prefetch`` buffer of at least ``BUFFER_MIN``
=================  ==========================================================================

Example:
    >>> data_in_ram(Facts(command=("python", "train.py"), probe=None)) is None
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from memfit.doctor.facts import (
    Facts,
    Finding,
    arg_size,
    array_names,
    describe_array,
    percent,
)
from memfit.sizes import format_size

__all__ = ["data_in_ram", "pipeline_buffers", "DATA_MIN", "DATA_SHARE", "BUFFER_MIN",
           "SHUFFLE_TARGET"]

MiB = 2**20
DATA_MIN = 64 * MiB             # data held in RAM below this is not worth streaming
DATA_SHARE = 0.10               # ... nor below this share of the peak
BUFFER_MIN = 64 * MiB           # a shuffle/prefetch buffer worth a finding
SHUFFLE_TARGET = 16 * MiB       # what a shuffle buffer needs, in bytes, to mix well


# -- data held in RAM --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Held:
    """Where a run holds its data in RAM (bytes)."""

    given: list[Mapping[str, Any]]          # the arrays given to fit()
    given_bytes: int
    growth_at_start: int                    # from the call of fit() to its first step
    copy: int                               # ... of which Keras's copy of the arrays
    pipeline: Mapping[str, Any]
    tensors: int                            # from_tensor_slices / from_tensors
    caches: list[Mapping[str, Any]]         # cache() buffers in memory
    cache_bytes: int
    others: int                             # other arrays alive during training

    @property
    def total(self) -> int:
        return self.given_bytes + self.copy + self.tensors + self.cache_bytes + self.others


def _held(f: Facts) -> _Held:
    given = f.given
    given_bytes = sum(a["nbytes"] for a in given)
    pipeline = f.fit.get("pipeline") or {}
    caches = [b for b in pipeline.get("buffers", []) if b["kind"] == "cache" and b["bytes"]]
    growth = f.first_step_growth or 0
    alive_total = (f.measurements.arrays or {}).get("total", 0)
    return _Held(given=given, given_bytes=given_bytes, growth_at_start=growth,
                 copy=min(growth, given_bytes) if given_bytes else 0, pipeline=pipeline,
                 tensors=int(pipeline.get("tensors_bytes", 0)), caches=caches,
                 cache_bytes=sum(b["bytes"] for b in caches),
                 others=max(0, alive_total - given_bytes))


def _held_measured(h: _Held, alive: Sequence[Mapping[str, Any]], peak: int) -> str:
    """What holds the data, in words with the numbers."""
    parts = []
    if h.given:
        args = ", ".join(f"{a['names'][0] if a['names'] else '?'}={a['dtype']} "
                         f"{tuple(a['shape'])} {format_size(a['nbytes'])}" for a in h.given[:4])
        parts.append(f"fit() was given {format_size(h.given_bytes)} of NumPy arrays ({args})")
        if h.copy:
            # the copy is at most the arrays: a stranger's 1 MiB of arrays was blamed for
            # the 34 MiB the first step grew on JAX (its compilation)
            parts.append(f"Keras copies in-memory arrays into tensors, so the data is held "
                         f"twice (up to {format_size(h.copy)} more; anonymous RSS grew "
                         f"{format_size(h.growth_at_start)} from the call of fit() to its "
                         f"first step)")
    if h.tensors:
        parts.append(f"the tf.data pipeline holds {format_size(h.tensors)} of tensors in "
                     f"memory (from_tensor_slices/from_tensors: "
                     f"{', '.join(h.pipeline['tensors'][:3])})")
    if h.cache_bytes:
        parts.append(f"cache() without a file name keeps {format_size(h.cache_bytes)} "
                     f"({h.caches[0]['elements']} elements) in memory after the first epoch")
    if h.others >= DATA_MIN // 4:
        listed = ", ".join(describe_array(a) for a in alive[:3])
        parts.append(f"{format_size(h.others)} of other NumPy arrays stay alive during "
                     f"training ({listed})")
    return ("; ".join(parts) + f". Together about {format_size(h.total)} of the "
            f"{format_size(peak)} peak anonymous RSS ({percent(h.total, peak)}).")


def _tuple(items: Sequence[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _stream_fix(f: Facts, h: _Held, budget: int) -> tuple[str, ...]:
    """The arrays to .npy files once, then streamed by ``memfit.dataset`` (or packed)."""
    alive = f.alive
    batch = f.fit.get("batch_size") or 32
    named = h.given[:4] or [a for a in alive if not a.get("container")][:2] or alive[:2]
    names = [array_names(a, i) for i, a in enumerate(named)]
    features = _tuple([f'"{k}"' for k, _ in names])
    sources = ", ".join(f'"{k}": "data/{k}.npy"' for k, _ in names)
    saves_text = "; ".join(f'np.save("data/{k}.npy", {v})' for k, v in names)
    pack_args = " ".join(f"{k}=data/{k}.npy" for k, _ in names)
    fix = (f"{saves_text}      # once: the arrays to .npy files",
           f"train = memfit.dataset({{{sources}}}, {batch}, features={features}, "
           f'memory_budget="{arg_size(budget)}")   # memory-mapped, read batch by batch',
           "model.fit(train, ...)      # instead of fit(arrays) / from_tensor_slices(arrays)",
           f"or packed into checksummed TFRecord shards: memfit pack {pack_args} -o "
           f'data/train, then memfit.dataset("data/train", {batch}, features={features})')
    if h.cache_bytes and not (h.given or h.tensors):
        fix = ('ds.cache("cache/train")    # cache to a file instead of memory, or drop '
               "cache()",) + fix[1:]
    return fix


def data_in_ram(f: Facts) -> Finding | None:
    """The data set (or other large arrays) held in the process's memory."""
    if not f.probe:
        return None
    h = _held(f)
    held, peak = h.total, f.peak
    if held < DATA_MIN or (peak and held < DATA_SHARE * peak):
        return None
    budget = min(256 * MiB, max(64 * MiB, 2 ** int(math.log2(max(held // 8, 1)))))
    saves = max(0, held - budget)
    stream = (f"Streamed from .npy files or packed shards, memory is the pipeline's budget "
              f"({arg_size(budget)} here), whatever the size of the data: about "
              f"{format_size(saves)} less.")
    if h.given or h.tensors or h.cache_bytes:
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
        "data-in-ram", title, saves, _held_measured(h, f.alive, peak), why,
        _stream_fix(f, h, budget),
        {"held": held, "fit_arrays": h.given_bytes, "keras_copy": h.copy,
         "tensors": h.tensors, "cache": h.cache_bytes, "other_arrays": h.others,
         "budget": budget, "peak": peak})


# -- pipeline buffers ----------------------------------------------------------------------

def pipeline_buffers(f: Facts) -> Finding | None:
    """``shuffle``/``prefetch`` buffers far larger than what they are for."""
    pipeline = f.fit.get("pipeline") or {}
    big = [b for b in pipeline.get("buffers", [])
           if b["kind"] in ("shuffle", "prefetch") and (b.get("bytes") or 0) >= BUFFER_MIN]
    if not big:
        return None
    parts, fix, saves = [], [], 0
    for b in big:
        each = b["element_bytes"]
        if b["kind"] == "shuffle":
            target = max(1, SHUFFLE_TARGET // each)
            saves += max(0, b["bytes"] - target * each)
            parts.append(f"shuffle(buffer_size={b['buffer_size']:,}) on elements of "
                         f"{b['element']} ({format_size(each)} each) holds "
                         f"{b['elements']:,} elements: {format_size(b['bytes'])}")
            fix.append(f"ds.shuffle(buffer_size={target:,})   # {format_size(target * each)} "
                       f"of elements instead of {format_size(b['bytes'])}")
        else:
            saves += max(0, b["bytes"] - 2 * each)
            parts.append(f"prefetch({b['buffer_size']:,}) of elements of {b['element']} "
                         f"({format_size(each)} each) holds {format_size(b['bytes'])}")
            fix.append("ds.prefetch(tf.data.AUTOTUNE)   # or prefetch(2): a few batches are "
                       "enough to hide the input's latency")
    measured = "; ".join(parts)
    if f.first_step_growth is not None:
        measured += (f". Anonymous RSS grew {format_size(f.first_step_growth)} from the call "
                     f"of fit() to its first step (a shuffle buffer fills before the first "
                     f"batch)")
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
        f"few {format_size(SHUFFLE_TARGET)} of elements already mix well when the input is "
        "itself in shuffled files. Prefetching more than a few batches only holds memory.",
        tuple(fix), {"buffers": big})

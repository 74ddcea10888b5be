"""What a ``tf.data`` pipeline passed to ``fit`` holds in memory, read from its objects.

:func:`inspect_dataset` walks the dataset's chain of Python objects (each transformation
keeps its input in ``_input_dataset``; zip and concatenate keep several) and reports:

* **buffers**: ``shuffle(buffer_size)`` holds up to ``buffer_size`` elements (or the
  whole input, when that is smaller); ``prefetch(n)`` holds ``n`` elements of its input
  (``AUTOTUNE``: tuned at run time, not counted); each element's size comes from the
  static ``element_spec`` at that point of the pipeline (unknown dimensions: not sized);
* **in-memory data**: the tensors of ``from_tensor_slices``/``from_tensors`` (NumPy
  arrays given to them are copied into such tensors), and ``cache()`` without a file
  name, which keeps every element of its input after the first pass.

Example:
    >>> import tensorflow as tf                                     # doctest: +SKIP
    >>> ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros([256, 256, 3]))  # doctest: +SKIP
    >>> info = inspect_dataset(ds.shuffle(500).batch(32))          # doctest: +SKIP
    >>> info.buffers[0].kind, info.buffers[0].bytes                 # doctest: +SKIP
    ('shuffle', 393216000)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from memfit.data.pipeline import is_dataset, nodes

__all__ = ["Buffer", "PipelineInfo", "inspect_dataset", "element_bytes"]


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A buffer of a pipeline.

    Attributes:
        kind: ``"shuffle"``, ``"prefetch"`` or ``"cache"``.
        buffer_size: the size asked, in elements (``None`` for a cache).
        elements: elements it holds when full (``buffer_size``, or the input's length
            when that is smaller and known).
        element_bytes: bytes of one element (``None`` when a dimension is unknown).
        bytes: ``elements × element_bytes`` (``None`` when either is unknown).
        element: the element's structure, e.g. ``float32 (64, 64, 3), float32 (1,)``.
    """

    kind: str
    buffer_size: int | None
    elements: int | None
    element_bytes: int | None
    bytes: int | None
    element: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Buffer:
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class PipelineInfo:
    """What :func:`inspect_dataset` found.

    Attributes:
        buffers: shuffle, prefetch and in-memory cache buffers, in pipeline order
            (source first).
        tensors_bytes: bytes of the tensors held by ``from_tensor_slices``/``from_tensors``.
        tensors: their descriptions (``float32 (20000, 3072)``).
        batch_size: the batch size of the last ``batch()``, if any (it also sizes the
            elements after it, whose first dimension is unknown without
            ``drop_remainder``).
        transformations: the pipeline's transformations, source first.
    """

    buffers: tuple[Buffer, ...] = ()
    tensors_bytes: int = 0
    tensors: tuple[str, ...] = ()
    batch_size: int | None = None
    transformations: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"buffers": [b.to_json() for b in self.buffers],
                "tensors_bytes": self.tensors_bytes, "tensors": list(self.tensors),
                "batch_size": self.batch_size, "transformations": list(self.transformations)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PipelineInfo:
        return cls(tuple(Buffer.from_json(b) for b in data.get("buffers", ())),
                   int(data.get("tensors_bytes", 0)), tuple(data.get("tensors", ())),
                   data.get("batch_size"), tuple(data.get("transformations", ())))


def _specs(structure: Any) -> Iterator[Any]:
    import tensorflow as tf

    yield from tf.nest.flatten(structure)


def element_bytes(element_spec: Any, batch_size: int | None = None) -> tuple[int | None, str]:
    """Bytes of one element of this structure of specs, and its description.

    Args:
        element_spec: a ``tf.data`` element spec (a structure of ``TensorSpec``).
        batch_size: stands for an unknown first dimension (a batch without
            ``drop_remainder``: at most this many samples).

    Returns:
        ``(bytes, description)``; bytes is ``None`` when a dimension is unknown or a
        component is not a plain tensor.
    """
    total: int | None = 0
    parts = []
    for spec in _specs(element_spec):
        shape = getattr(spec, "shape", None)
        dtype = getattr(spec, "dtype", None)
        dims = None if shape is None or shape.rank is None else shape.as_list()
        if dims and dims[0] is None and batch_size:
            dims[0] = batch_size
        parts.append(f"{getattr(dtype, 'name', '?')} "
                     f"{tuple(dims) if dims is not None else '(?)'}")
        if (total is None or dims is None or any(d is None for d in dims)
                or type(spec).__name__ != "TensorSpec" or dtype.size is None):
            total = None
            continue
        total += math.prod(dims) * dtype.size
    return total, ", ".join(parts)


def _int(tensor: Any) -> int | None:
    try:
        return int(tensor)
    except (TypeError, ValueError):
        return None


def inspect_dataset(ds: Any) -> PipelineInfo:
    """Reads the buffers and in-memory tensors of a ``tf.data`` pipeline.

    Args:
        ds: a ``tf.data.Dataset``.

    Raises:
        ValueError: if ``ds`` is not a ``tf.data.Dataset``, quoting its type.
    """
    if not is_dataset(ds):
        raise ValueError(f"inspect_dataset needs a tf.data.Dataset. Received: ds of type "
                         f"{type(ds).__name__}")
    buffers, tensors, names = [], [], []
    tensors_bytes, batch_size = 0, None
    for node in nodes(ds):
        kind = type(node).__name__.lstrip("_").replace("Dataset", "") or "Dataset"
        names.append(kind)
        if kind in ("TensorSlice", "Tensor") and hasattr(node, "_tensors"):
            for t in _specs(node._tensors):
                n = getattr(t, "shape", None)
                if n is None or n.num_elements() is None:
                    continue
                size = n.num_elements() * t.dtype.size
                tensors_bytes += size
                tensors.append(f"{t.dtype.name} {tuple(n.as_list())}")
        elif kind in ("Batch", "ParallelBatch") and hasattr(node, "_batch_size"):
            batch_size = _int(node._batch_size)
        elif kind in ("Shuffle", "Prefetch"):
            size = _int(getattr(node, "_buffer_size", None))
            if size is None or size < 0:          # AUTOTUNE: tuned while running
                continue
            elements = size
            source = getattr(node, "_input_dataset", None)
            if source is not None:
                card = _int(source.cardinality())
                if card is not None and card >= 0:
                    elements = min(size, card)
            each, element = element_bytes(node.element_spec, batch_size)
            buffers.append(Buffer(kind.lower(), size, elements, each,
                                  None if each is None else each * elements, element))
        elif kind == "Cache":
            filename = getattr(node, "_filename", None)
            try:
                in_memory = filename is None or filename.numpy() == b""
            except AttributeError:
                in_memory = False
            if not in_memory:
                continue
            card = _int(node.cardinality())
            each, element = element_bytes(node.element_spec, batch_size)
            elements = card if card is not None and card >= 0 else None
            total = None if each is None or elements is None else each * elements
            buffers.append(Buffer("cache", None, elements, each, total, element))
    return PipelineInfo(tuple(buffers), tensors_bytes, tuple(tensors), batch_size,
                        tuple(names))

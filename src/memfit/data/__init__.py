"""Data: pack sources into checksummed TFRecord shards (or ``.npy`` files), stream them
under a byte budget; ``.npy`` sources are read memory-mapped with a global shuffle.

The modules, by concept:

- the formats: :mod:`~memfit.data.records` (TFRecord framing, ``tf.train.Example``; it
  owns memfit's C extension, :mod:`memfit.data.cwindow`), :mod:`~memfit.data.manifest`
  (the shards' ``manifest.json``), :mod:`~memfit.data.arrays_format` (the "memfit-arrays"
  directory, ``.npy`` files).
- packing: :mod:`~memfit.data.pack` (``memfit.pack``), :mod:`~memfit.data.packing` (its
  options and what both packers share), :mod:`~memfit.data.pack_output` (the output
  directory: resuming, undoing), :mod:`~memfit.data.sources` (what is packed), and the
  packers :mod:`~memfit.data.pack_shards` and :mod:`~memfit.data.arrays_pack`.
- reading: :mod:`~memfit.data.stream` (``memfit.dataset``, the dispatcher),
  :mod:`~memfit.data.plan` (the plans), the block reader (:mod:`~memfit.data.blocks`,
  :mod:`~memfit.data.block_layout`, :mod:`~memfit.data.block_io`,
  :mod:`~memfit.data.block_plan`), the TF reader (:mod:`~memfit.data.tf_reader`), the
  arrays reader (:mod:`~memfit.data.arrays_reader`, :mod:`~memfit.data.arrays_input`),
  and what they share: :mod:`~memfit.data.arguments`, :mod:`~memfit.data.buffers`,
  :mod:`~memfit.data.feeder`, :mod:`~memfit.data.pipeline`.
- checking: :mod:`~memfit.data.verify` (``memfit inspect``, ``memfit verify``).

``memfit.data.stream`` imports TensorFlow; it is loaded on first use so that packing and
the command line start fast.
"""

from typing import Any

from memfit.data.arrays_format import ArraysManifest
from memfit.data.arrays_reader import ArraysPlan
from memfit.data.manifest import Feature, Manifest
from memfit.data.pack import PackResult, pack
from memfit.data.plan import DatasetPlan
from memfit.data.verify import inspect, verify

__all__ = ["ArraysManifest", "ArraysPlan", "Feature", "Manifest", "PackResult", "dataset",
           "DatasetPlan", "inspect", "pack", "verify"]


def __getattr__(name: str) -> Any:
    if name == "dataset":
        from memfit.data import stream

        return stream.dataset
    raise AttributeError(f"module 'memfit.data' has no attribute {name!r}")
